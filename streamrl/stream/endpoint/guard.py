"""What every HTTP request passes before any route sees it (a plain ASGI middleware).

``GET /health`` alone is answered here without a token, with ``{"status": "ok"}`` and
nothing else (a liveness probe: a load balancer's or an orchestrator's, which carries no
secret; it tells no more than an open port does). Every other request, in this order,
each from the request's headers alone until the body is read:

1. exactly one ``Authorization: Bearer <token>`` header (or the header and scheme the
   application names: the Tinker service takes ``X-API-Key: <token>``), compared as
   bytes in constant time, or 401 (a malformed value is only a wrong one);
2. a ``Content-Length`` over ``endpoint.max_body_bytes``: 413 at once;
3. the body, read up to ``endpoint.max_body_bytes`` (413 as soon as it is more,
   chunked bodies too) and within ``endpoint.read_timeout_s`` (408).

A refused request's body is never read: the answer carries ``Connection: close`` and
the server drops the rest. Only then does the application run, with the body it was
given in memory.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

Scope = dict[str, Any]
TOO_LARGE = object()


class RequestGuard:
    def __init__(
        self,
        app: Any,
        token: str,
        max_body_bytes: int,
        read_timeout_s: float,
        header: bytes = b"authorization",
        scheme: str = "Bearer ",
    ) -> None:
        self.app = app
        self.header = header
        self.expected = f"{scheme}{token}".encode()
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/health":
            await respond(send, 200, {"status": "ok"})
            return
        headers = scope["headers"]
        auth = [v for k, v in headers if k == self.header]
        if len(auth) != 1 or not hmac.compare_digest(auth[0], self.expected):
            await refuse(send, 401, "missing or wrong token", "authentication_error")
            return
        lengths = [v for k, v in headers if k == b"content-length"]
        if lengths and not all(v.isdigit() and int(v) <= self.max_body_bytes for v in lengths):
            await refuse(send, 413, self._too_large())
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.read_timeout_s)
        except asyncio.TimeoutError:
            await refuse(send, 408, f"the body did not arrive within {self.read_timeout_s} s")
            return
        if body is TOO_LARGE:
            await refuse(send, 413, self._too_large())
        elif body is not None:  # None: the client left
            await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> str:
        return f"the body is larger than {self.max_body_bytes} bytes (endpoint.max_body_bytes)"

    async def _read(self, receive: Any) -> bytes | object | None:
        """The body; ``TOO_LARGE`` as soon as it is; None if the client left."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return TOO_LARGE
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """``receive`` for the application: the body already read, then the client's own
    (a disconnect)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def refuse(send: Any, status: int, message: str, kind: str = "invalid_request_error"):
    """An OpenAI-style error that closes the connection (its body is left unread)."""
    await respond(send, status, {"error": {"message": message, "type": kind}})


async def respond(send: Any, status: int, body: dict[str, Any]) -> None:
    """``body`` as JSON, closing the connection (a request body is left unread)."""
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})

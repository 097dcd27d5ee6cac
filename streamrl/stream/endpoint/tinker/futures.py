"""Tinker's futures: every call that computes answers at once with a request id; the client
polls ``retrieve_future`` with it until the result is there.

A poll waits up to ``poll_s`` for its result and then answers ``try_again``. A result is a
JSON object or protobuf bytes (``ForwardBackwardOutput`` and ``SampleResponse``, which the
client reads only as protobuf); a failure answers ``{"error", "category"}`` (category
``user`` for a request the caller can fix), which the client raises. A result is kept
``KEEP_S`` after it is done, so a poll whose answer was lost is answered again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("streamrl.tinker")

KEEP_S = 600.0


class UserError(Exception):
    """A request the caller can fix: its future fails with category ``user``."""


@dataclass
class Result:
    json: dict[str, Any] | None = None
    proto: bytes | None = None


class Futures:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self._done_at: dict[str, float] = {}
        self._ids = itertools.count(1)
        self.failed = 0  # futures that failed (either category)

    def submit(self, work: Awaitable[Result], kind: str) -> str:
        """Starts ``work``; returns its request id."""
        self._expire()
        request_id = f"{kind}-{next(self._ids)}"
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda _: self._done_at.__setitem__(request_id, time.monotonic()))
        self._tasks[request_id] = task
        return request_id

    def known(self, request_id: str) -> bool:
        return request_id in self._tasks

    async def retrieve(self, request_id: str, wait_s: float) -> tuple[int, dict | bytes]:
        """(HTTP status, body): the result, its failure, or ``try_again``."""
        task = self._tasks[request_id]
        if not task.done():
            await asyncio.wait([task], timeout=wait_s)
        if not task.done():
            return 200, {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        exc = task.exception()
        if exc is not None:
            return 200, self._failure(request_id, exc)
        result: Result = task.result()
        return 200, result.proto if result.proto is not None else (result.json or {})

    def _failure(self, request_id: str, exc: BaseException) -> dict[str, Any]:
        user = isinstance(exc, UserError | ValueError)
        if not user:
            log.error("tinker: request %s failed", request_id, exc_info=exc)
        return {"error": str(exc) or type(exc).__name__, "category": "user" if user else "server"}

    def _expire(self) -> None:
        now = time.monotonic()
        old = [k for k, t in self._done_at.items() if now - t > KEEP_S]
        for k in old:
            task = self._tasks.pop(k, None)
            self._done_at.pop(k, None)
            if task is not None and not task.cancelled() and task.exception() is not None:
                self.failed += 1

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()

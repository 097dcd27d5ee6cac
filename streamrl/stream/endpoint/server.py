"""The endpoint's HTTP server: uvicorn (h11) with limits on slow and large requests.

- request headers must arrive within ``endpoint.header_timeout_s`` of the connection
  opening or of the previous response (a connection that trickles them is closed) and
  fit in ``MAX_HEADER_BYTES`` (h11 answers 400 otherwise);
- an idle keep-alive connection is closed after ``KEEP_ALIVE_S``;
- on shutdown, calls still generating get ``SHUTDOWN_GRACE_S`` before they are
  cancelled (sessions waiting for admission were refused before, see
  :meth:`SessionTable.stop`).

The body's own limits (size, read timeout) and the token are checked by
:mod:`streamrl.stream.endpoint.guard`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 16 * 1024
KEEP_ALIVE_S = 5
SHUTDOWN_GRACE_S = 5


class HeaderTimeoutProtocol(H11Protocol):
    """h11 that closes a connection whose next request's headers are late."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():  # the headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _late(self) -> None:
        self._header_deadline = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()


def make_server(app: Any, endpoint: Any) -> uvicorn.Server:
    """A uvicorn server for ``app`` on ``endpoint.host``/``endpoint.port`` (not started)."""
    protocol = type(
        "EndpointProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_s": endpoint.header_timeout_s},
    )
    config = uvicorn.Config(
        app,
        host=endpoint.host,
        port=endpoint.port,
        log_level="warning",
        http=protocol,
        ws="none",
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    return uvicorn.Server(config)

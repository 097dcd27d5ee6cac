"""When a rank is hung: the rule by which a rank group's driver (the Ray driver, the
local supervisor) pings its ranks. A rank that leaves a ping unanswered for
``timeout_s`` is hung: a stopped rank 0 (SIGSTOP) waiting for nothing fails no
collective. A round of pings goes out every ``timeout_s / 4`` (at most every 10 s) once
the previous one is in; an answer read late, after the timeout, still counts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamrl.engines.train.group.spec import RankGroupFailed


class Pings:
    """``send()`` sends a round (one handle per rank, in rank order); ``pending(handles)``
    gives the ranks whose answer has not come in yet."""

    def __init__(
        self,
        send: Callable[[], list[Any]],
        pending: Callable[[list[Any]], list[int]],
        timeout_s: float,
    ) -> None:
        self.send, self.pending, self.timeout_s = send, pending, timeout_s
        self.every_s = min(10.0, timeout_s / 4)
        self.handles: list[Any] = []
        self.sent = time.monotonic()

    def check(self) -> None:
        """Send the next round if one is due; raise :class:`RankGroupFailed` naming the
        ranks that left the current one unanswered for ``timeout_s``."""
        now = time.monotonic()
        if not self.handles:
            if now - self.sent >= self.every_s:
                self.handles, self.sent = self.send(), now
            return
        hung = self.pending(self.handles)
        if not hung:
            self.handles = []
        elif now - self.sent > self.timeout_s:
            raise RankGroupFailed(
                f"rank(s) {hung} answered no ping for {self.timeout_s:.0f}s "
                "(train.collective_timeout_s): hung"
            )

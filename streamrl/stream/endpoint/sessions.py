"""The endpoint's sessions: one admitted item each, from the first call to its end.

A session lives on the server's event loop:

1. The first call with a new ``session_id`` creates it at once, before anything is
   awaited, so every call with that id (concurrent ones too) joins the same session
   and a session asks the stream for exactly one item.
2. It waits, first come first served, for admission: one task (the admitter) asks the
   stream for one item at a time under the staleness bound and hands it to the oldest
   waiting session. A session whose callers all left before it was admitted leaves
   the queue; an item admitted when no session waits any more is rejected at once
   (``failed: session_abandoned``).
3. Admitted, it records each call's completions under the call's number, so they come
   back in call order whatever order the calls finish in.
4. It ends exactly once: by its reward (the pool puts or filters the group), by idling
   ``endpoint.session_timeout_s`` with no call in progress (``failed:
   session_timeout``), or with the run (the stream's close counts it ``run_ended``).

:meth:`SessionTable.stop` (a graceful stop, or the run's end) refuses the sessions
still waiting with 503 and counts them (``endpoint/sessions_refused``): no item was
issued for them, and nothing is left waiting for an admission.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from streamrl.core.messages import GroupRejected
from streamrl.core.types import Trajectory
from streamrl.stream.endpoint.openai_format import EndpointError
from streamrl.stream.sample_stream import SampleStream, StreamClosed

RUN_ENDED = "the run has ended: no new sessions"
ADMIT_POLL_S = 0.05  # an admission waits at most this long before it looks again


@dataclass(eq=False)
class EndpointSession:
    session_id: str
    admitted: asyncio.Future[int]  # the item index, once admitted
    calls: int = 0  # call numbers handed out (each call's sampling seeds)
    results: dict[int, list[Trajectory]] = field(default_factory=dict)  # call -> completions
    active: int = 0  # calls in progress: waiting for admission or generating
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def is_admitted(self) -> bool:
        f = self.admitted
        return f.done() and not f.cancelled() and f.exception() is None

    @property
    def item_index(self) -> int:
        return self.admitted.result()

    def trajectories(self) -> list[Trajectory]:
        """The recorded completions, in call order."""
        return [t for call in sorted(self.results) for t in self.results[call]]


class SessionTable:
    """The sessions by id, the admission queue and its admitter task.

    ``version()`` is the engine's weight version (items are admitted at it), ``held()``
    whether admission is off (``admit(False)``), ``end(msg)`` ends an item (the pool's
    books)."""

    def __init__(
        self,
        stream: SampleStream,
        version: Callable[[], int],
        held: Callable[[], bool],
        end: Callable[[GroupRejected], None],
    ) -> None:
        self.stream, self.version, self.held, self.end = stream, version, held, end
        self.sessions: dict[str, EndpointSession] = {}
        self.counts = {"sessions": 0, "sessions_refused": 0, "sessions_abandoned": 0}
        self.stopping = False
        self._queue: collections.deque[EndpointSession] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._admit_thread = ThreadPoolExecutor(1, "endpoint-admit")

    # ------------------------------------------------------------ calls (server loop)

    @contextlib.asynccontextmanager
    async def call(self, session_id: str) -> AsyncIterator[EndpointSession]:
        """One call of session ``session_id`` (created by its first call): waits for its
        admission, then yields it; 503 once the run ends."""
        s = self.sessions.get(session_id)
        if s is None:
            if self.stopping or self.stream.closed:
                self.counts["sessions_refused"] += 1
                raise EndpointError(503, RUN_ENDED)
            s = EndpointSession(session_id, asyncio.get_running_loop().create_future())
            self.sessions[session_id] = s
            self._queue.append(s)
            self._wakeup()
        s.active += 1
        try:
            try:
                await asyncio.shield(s.admitted)
            except asyncio.CancelledError:
                if s.active == 1 and not s.admitted.done():  # its last caller left
                    self._forget(s)
                raise
            yield s
        finally:
            s.active -= 1
            s.last_seen = time.monotonic()

    def ending(self, session_id: str) -> EndpointSession:
        """The session a reward ends (the caller ends its item); 404 if there is none,
        409 while it is not admitted yet or a call of it is in progress."""
        s = self.sessions.get(session_id)
        if s is None:
            raise EndpointError(404, f"no open session {session_id!r}")
        if not s.is_admitted:
            raise EndpointError(409, f"session {session_id!r} is still waiting for admission")
        if s.active:
            raise EndpointError(
                409,
                f"session {session_id!r} has {s.active} call(s) in progress: report its "
                "reward once they return",
            )
        return s

    def remove(self, s: EndpointSession) -> None:
        if self.sessions.get(s.session_id) is s:
            del self.sessions[s.session_id]

    def expire(self, limit_s: float) -> list[str]:
        """Ends the admitted sessions idle for ``limit_s`` with no call in progress
        (``failed: session_timeout``); returns their ids."""
        now, gone = time.monotonic(), []
        for s in list(self.sessions.values()):
            if s.is_admitted and not s.active and now - s.last_seen > limit_s:
                self.remove(s)
                self.end(GroupRejected(s.item_index, "failed", "session_timeout"))
                gone.append(s.session_id)
        return gone

    @property
    def open(self) -> int:
        """Sessions admitted and not ended."""
        return sum(s.is_admitted for s in list(self.sessions.values()))

    @property
    def waiting(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------ the admitter

    async def admit_forever(self) -> None:
        """Hands items to waiting sessions, oldest first, under the staleness bound."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            if not self._queue and not self.stopping:
                self._wake.clear()
                await self._wake.wait()
            if self.stopping or self.stream.closed:
                self._refuse_waiting()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.held():  # the trainer holds admission (e.g. its last step)
                await asyncio.sleep(ADMIT_POLL_S)
                continue
            try:
                got = await self._loop.run_in_executor(
                    self._admit_thread, self.stream.admit, self.version(), 1, ADMIT_POLL_S
                )
            except (StreamClosed, RuntimeError):  # closed, or stop() shut the thread down
                continue  # the next turn refuses the waiting sessions
            for index in got:
                self._assign(index)

    def stop(self) -> None:
        """From any thread: refuse the waiting sessions and every new one."""
        self.stopping = True
        self._wakeup()
        self._admit_thread.shutdown(wait=False)

    def _wakeup(self) -> None:
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # the server's loop is closed already
                self._loop.call_soon_threadsafe(self._wake.set)

    def _assign(self, index: int) -> None:
        if self.stopping:  # admitted while the run stops: nobody will use it
            self._release(index, "filtered", "run_ended")
            return
        while self._queue:
            s = self._queue.popleft()
            if not s.admitted.done():
                s.admitted.set_result(index)
                s.last_seen = time.monotonic()
                self.counts["sessions"] += 1
                return
        self._release(index, "failed", "session_abandoned")

    def _release(self, index: int, outcome: str, reason: str) -> None:
        with contextlib.suppress(StreamClosed):  # closed meanwhile: close() counted it
            self.end(GroupRejected(index, outcome, reason))  # type: ignore[arg-type]

    def _forget(self, s: EndpointSession) -> None:
        """A session whose callers all left before its admission."""
        s.admitted.cancel()
        with contextlib.suppress(ValueError):
            self._queue.remove(s)
        self.remove(s)
        self.counts["sessions_abandoned"] += 1

    def _refuse_waiting(self) -> None:
        while self._queue:
            s = self._queue.popleft()
            if not s.admitted.done():
                s.admitted.set_exception(EndpointError(503, RUN_ENDED))
                self.counts["sessions_refused"] += 1
            self.remove(s)

"""Graceful stop: the first SIGINT or SIGTERM asks the run to stop, a second aborts.

The controller checks :attr:`GracefulStop.requested` between steps; it then stops
admission, writes a checkpoint and ``summary.json`` with ``"status": "interrupted"``,
and the command exits non-zero (128 + the signal number, as a shell reports it).
Handlers are installed only in the main thread (a Ray trainer actor is stopped with
:meth:`request` instead).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The run stopped on a signal after checkpointing; ``exit_code`` = 128 + signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum

    def __reduce__(self) -> tuple:  # crosses a pipe with its signal (the local supervisor)
        return (type(self), (str(self), self.exit_code - 128), self.__dict__)


class GracefulStop:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum = int(signal.SIGINT)
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, signum: int = signal.SIGTERM) -> None:
        self.signum = int(signum)
        self._event.set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():  # the second signal: abort at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.request(signum)
        print(
            f"\nstreamrl: {signal.Signals(signum).name} received: stopping at the next step "
            "boundary and writing a checkpoint (send it again to abort at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

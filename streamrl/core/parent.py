"""A helper process that lives only as long as its parent, and leaves stopping to it."""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_POLL_S = 0.5


def exit_with_parent(parent: int) -> None:
    """A daemon thread: end this process when its parent is gone (SIGKILLed or exited),
    so a killed run leaves no process behind."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM: a Ctrl-C reaches the terminal's whole process group, and
    the parent, which gets it too, decides how this process stops."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)

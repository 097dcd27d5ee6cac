"""One writer per run directory: ``RUN_DIR/run.lock``, held with ``flock`` for as long as a
process trains, resumes or serves the run (the Ray driver holds it for its trainer actor).

A second process that wants the same directory gets :class:`RunDirectoryInUse` at once,
one line naming the holder's pid. The kernel drops the lock when its holder exits, even
on SIGKILL, so a killed run never leaves its directory locked. Within one process the
lock is re-entrant (the command line and the controller both take it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "run.lock"

_held: dict[Path, int] = {}  # resolved run directory -> how many holders in this process
_guard = threading.Lock()


class RunDirectoryInUse(BlockingIOError):
    """Another process holds the run directory; the message names it."""

    def __str__(self) -> str:
        return str(self.args[0])


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "pid unknown"
    return f"pid {text}" if text.isdigit() else "pid unknown"


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the ``with`` block (see the module docstring)."""
    key = Path(run_dir).resolve()
    with _guard:
        if key in _held:
            _held[key] += 1
            fd = None
        else:
            fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunDirectoryInUse(
                    f"run directory {run_dir} is in use by another streamrl process "
                    f"({holder}); wait for it to end or stop it, then try again"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _held[key] = 1
    try:
        yield
    finally:
        with _guard:
            _held[key] -= 1
            if _held[key] == 0:
                del _held[key]
        if fd is not None:  # the outermost holder: closing the file releases the lock
            os.close(fd)

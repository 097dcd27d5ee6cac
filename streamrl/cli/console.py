"""The console may go away while a run goes on, or never be there: a closed pipe
(``streamrl serve | head -1``, a supervisor that read the first line) or a process started
with its standard streams closed (``streamrl serve >&- 2>&-``, some daemon launchers) must
not end a run that writes everything it needs to ``run.log``. Writes to a console that is
gone are dropped; a standard stream that is closed is opened on the null device."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class ConsoleStream:
    """A text stream that drops writes once its reader has gone (EPIPE), instead of
    raising ``BrokenPipeError`` into whatever printed."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self.gone = stream, False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self.gone = True

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def _reopen_closed_descriptors() -> None:
    """Descriptors 0-2 that are closed are opened on the null device: otherwise the next
    file the run opens (``run.log``, a checkpoint) would take their number, and a library
    or a child process writing to "stderr" would write into it."""
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def tolerate_a_closed_console() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once) for the rest of the process; a
    stream Python could not open (``None``: its descriptor was closed at start) becomes
    one on the null device, so libraries that ask it (``isatty()``) keep working."""
    _reopen_closed_descriptors()
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin until it ends
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
        if not isinstance(stream, ConsoleStream):
            setattr(sys, name, ConsoleStream(stream))

"""The console may go away while a run goes on: a closed pipe (``streamrl serve | head -1``,
a supervisor that read the first line) must not end a run that writes everything it
needs to ``run.log``. Writes to a console that is gone are dropped, once noted."""

from __future__ import annotations

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


def tolerate_a_closed_console() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once) for the rest of the process."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ConsoleStream):
            setattr(sys, name, ConsoleStream(stream))

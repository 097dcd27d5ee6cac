"""Named, timed stages of the loop (verl's ``marked_timer`` habit)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StageTimer:
    """``with timer("update"): ...`` adds the block's wall time to ``seconds["time/update"]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{name}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0

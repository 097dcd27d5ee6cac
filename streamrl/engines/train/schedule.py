"""Learning-rate schedules: linear warm-up, then constant, linear or cosine decay.

``lr_factor(step, ...)`` is the multiplier of the peak learning rate for the
optimizer step with 0-based index ``step`` (the first step uses ``step = 0``)::

    warm-up  (step < warmup):        (step + 1) / warmup
    constant:                        1
    linear:   m + (1 - m) * (1 - p)
    cosine:   m + (1 - m) * (1 + cos(pi * p)) / 2

with ``p = (step - warmup) / max(1, total - warmup - 1)`` clamped to [0, 1], so the
first step after warm-up runs at the peak and the last step (``total - 1``) at
``min_ratio``. ``total`` is the number of optimizer steps of the stage.

>>> [round(lr_factor(s, "linear", warmup=2, total=6), 3) for s in range(6)]
[0.5, 1.0, 1.0, 0.667, 0.333, 0.0]
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(
    step: int, schedule: str, *, warmup: int = 0, total: int = 0, min_ratio: float = 0.0
) -> float:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; known: {SCHEDULES}")
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup - 1)))
    if schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = (1.0 + math.cos(math.pi * progress)) / 2
    return min_ratio + (1.0 - min_ratio) * shape

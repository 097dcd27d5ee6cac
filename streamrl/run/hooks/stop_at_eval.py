"""``run.stop_at_eval``: the run ends after the step whose evaluation (``eval/return``
for an environment, else ``eval/accuracy``) reaches the threshold."""

from __future__ import annotations

from typing import Any

from streamrl.run.hooks.base import Decision, StepHook, last_step
from streamrl.stream.pools import Pool


def reached(row: dict[str, float], threshold: float | None) -> bool:
    """Whether an evaluation in ``row`` reached ``threshold`` (return or accuracy)."""
    value = row.get("eval/return", row.get("eval/accuracy"))
    return threshold is not None and value is not None and value >= threshold


class StopAtEval(StepHook):
    def __init__(self, pool: Pool, threshold: float | None, summary: dict[str, Any]) -> None:
        self.pool, self.threshold, self.summary = pool, threshold, summary

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        if reached(row, self.threshold):
            return last_step(self.pool, self.summary, step)
        return Decision.CONTINUE

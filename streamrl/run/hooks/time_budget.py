"""``run.max_rl_seconds``: the run ends after the step that spends the RL time budget
(counted across resumes); the final evaluation and the checkpoint still follow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.run.hooks.base import Decision, StepHook, last_step
from streamrl.stream.pools import Pool


class TimeBudget(StepHook):
    def __init__(
        self,
        pool: Pool,
        budget_s: float,
        spent_s: Callable[[], float],
        steps: int,
        summary: dict[str, Any],
    ) -> None:
        self.pool, self.budget_s, self.spent_s = pool, budget_s, spent_s
        self.steps, self.summary = steps, summary

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        if step < self.steps and self.spent_s() >= self.budget_s:
            return last_step(self.pool, self.summary, step)
        return Decision.CONTINUE

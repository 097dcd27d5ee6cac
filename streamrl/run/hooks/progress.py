"""The caller's progress callback (the console's bar, a notebook's) after each step."""

from __future__ import annotations

from collections.abc import Callable

from streamrl.run.hooks.base import Decision, StepHook

Progress = Callable[[str, int, int, dict], None]  # (stage, step, steps, row)


class ReportProgress(StepHook):
    def __init__(self, progress: Progress, steps: int) -> None:
        self.progress, self.steps = progress, steps

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        self.progress("rl", step, self.steps, row)
        return Decision.CONTINUE

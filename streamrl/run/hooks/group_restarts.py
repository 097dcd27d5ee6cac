"""``train/group_restarts`` in every RL row of a run with a rank group: how often the
group has been restarted from a checkpoint so far (:mod:`streamrl.run.ranks`)."""

from __future__ import annotations

from streamrl.run.hooks.base import Decision, StepHook


class GroupRestarts(StepHook):
    def __init__(self, key: str, restarts: int) -> None:
        self.key, self.restarts = key, restarts

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        row[self.key] = float(self.restarts)
        return Decision.CONTINUE

"""What each RL step leaves on disk: the ledger of how items ended (every step, taken
atomically with the pool's books), the metrics row (the last one waits for the final
evaluation), and a checkpoint every ``run.checkpoint_every`` steps or when a graceful
stop was asked for (:mod:`streamrl.run.hooks.graceful_stop` then ends the run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.run.hooks.base import Decision, StepHook
from streamrl.run.signals import GracefulStop


class Checkpoints(StepHook):
    def __init__(
        self,
        books: Callable[[], dict[str, Any]],
        log_row: Callable[[int, dict[str, float]], None],
        save: Callable[[int, dict[str, Any]], None],
        every: int,
        steps: int,
        stop: GracefulStop,
    ) -> None:
        self.books, self.log_row, self.save = books, log_row, save
        self.every, self.steps, self.stop = every, steps, stop

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        state = self.books()  # writes the ledger up to now: before the row
        if step < self.steps:
            self.log_row(step, row)
            if (self.every and step % self.every == 0) or self.stop.requested:
                self.save(step, state)
        return Decision.CONTINUE

"""The first SIGINT or SIGTERM (:class:`~streamrl.run.signals.GracefulStop`): admission
stops and the run ends at a step boundary with a checkpoint, ``summary.json`` saying
``interrupted``, and :class:`~streamrl.run.signals.Interrupted` raised. Asked for while
the trainer waits for a batch, the checkpoint is of the step before; asked for during a
step, of that step (written by :mod:`streamrl.run.hooks.checkpoints`, listed before
this hook). During the last step it changes nothing: the run ends anyway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.run.hooks.base import Decision, StepHook
from streamrl.run.signals import GracefulStop
from streamrl.stream.pools import Pool


class StopOnRequest(StepHook):
    def __init__(
        self,
        stop: GracefulStop,
        pool: Pool,
        steps: int,
        books: Callable[[], dict[str, Any]],
        save: Callable[[int, dict[str, Any]], None],
        interrupted: Callable[[int], BaseException],
    ) -> None:
        self.stop, self.pool, self.steps = stop, pool, steps
        self.books, self.save, self.interrupted = books, save, interrupted

    def while_waiting(self, step: int) -> float | None:
        if self.stop.requested:  # no batch for ``step`` yet: stop after the one before
            self.pool.admit(False)
            self.save(step - 1, self.books())
            raise self.interrupted(step - 1)
        return None

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        if self.stop.requested and step < self.steps:
            self.pool.admit(False)
            raise self.interrupted(step)
        return Decision.CONTINUE

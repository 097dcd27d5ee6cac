"""Colocated placement (``runtime.placement: colocated``, or auto's choice): the trainer
and generation time-share the cores, so generation stops while the trainer trains.

With ``rollout.partial_rollouts`` an unfinished item is carried over into the next
version (paused between two decode steps, resumed after the publish); without it nothing
may be carried over, so admission stops and every admitted item finishes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.run.hooks.base import StepHook
from streamrl.stream.pools import Pool


@dataclass
class Sharing:
    """Whether the trainer and generation time-share the cores now; the placement hook
    changes it (``runtime.placement: auto``), the others read it."""

    on: bool


class TimeSharing(StepHook):
    def __init__(self, pool: Pool, sharing: Sharing, last_step: int, carry_over: bool) -> None:
        self.pool, self.sharing, self.last_step = pool, sharing, last_step
        self.carry_over = carry_over  # rollout.partial_rollouts

    def before_update(self, step: int) -> None:
        if not self.sharing.on:
            return
        if not self.carry_over:  # nothing may be carried over: finish them all
            self.pool.admit(False)
            self.pool.finish_inflight()
        self.pool.pause_generation()

    def after_publish(self, step: int) -> None:
        if self.sharing.on and step < self.last_step:  # (after the last, the pool stops)
            self.pool.admit(True)
            self.pool.resume_generation()

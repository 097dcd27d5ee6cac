"""The step-hook interface: everything the RL loop does besides the algorithm.

The loop (:mod:`streamrl.run.loop`) takes a batch, prepares it, updates and publishes.
Placement, lending cores, evaluation, the time budget, checkpoints and the graceful stop
each sit in a hook of their own (a module of :mod:`streamrl.run.hooks`), called at five
points of every step, in the order the hooks are listed:

=================  ==============================================================
``on_start``       the pool has started (before the first weight version is awaited)
``while_waiting``  before each poll for the step's batch: use the wait, or end the run
``before_update``  the batch is in hand, the update comes next
``after_publish``  the step's weights are published
``after_step``     the step's metrics row is complete: add to it, or stop the run
``on_end``         the loop is over (normally, stopped early, or by an error)
=================  ==============================================================

Every method has a no-op default: a hook derives from :class:`StepHook` and overrides
what it needs.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

from streamrl.stream.pools import Pool

POLL_S = 1.0  # how long one poll for a batch blocks when no hook asks for less


class Decision(enum.Enum):
    """What :meth:`StepHook.after_step` says: go on, or end the run after this step."""

    CONTINUE = "continue"
    STOP = "stop"


class StepHook(Protocol):
    def on_start(self) -> None:
        """The pool has started; nothing has been awaited yet."""

    def while_waiting(self, step: int) -> float | None:
        """Called before each poll for ``step``'s batch. It may do useful work meanwhile,
        or end the run (raise). Returns the longest the poll may block (None: no
        preference)."""
        return None

    def before_update(self, step: int) -> None:
        """``step``'s batch is in hand; it is prepared and trained on next."""

    def after_publish(self, step: int) -> None:
        """Weight version ``step`` is published and the stream knows it."""

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        """``row`` holds ``step``'s metrics; a hook may add to it. ``STOP`` makes this step
        the run's last (the hooks after this one are not called)."""
        return Decision.CONTINUE

    def on_end(self) -> None:
        """The loop is over and the pool stopped (also after an error)."""


class Hooks:
    """The loop's hooks, called in order at each point of a step."""

    def __init__(self, hooks: Sequence[StepHook]) -> None:
        self.hooks = tuple(hooks)

    def on_start(self) -> None:
        for hook in self.hooks:
            hook.on_start()

    def while_waiting(self, step: int) -> float:
        """The shortest poll any hook asked for (``POLL_S`` if none did)."""
        asked = [s for s in (hook.while_waiting(step) for hook in self.hooks) if s is not None]
        return min(asked, default=POLL_S)

    def before_update(self, step: int) -> None:
        for hook in self.hooks:
            hook.before_update(step)

    def after_publish(self, step: int) -> None:
        for hook in self.hooks:
            hook.after_publish(step)

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        for hook in self.hooks:
            if hook.after_step(step, row) is Decision.STOP:
                return Decision.STOP
        return Decision.CONTINUE

    def on_end(self) -> None:
        for hook in self.hooks:
            hook.on_end()


def last_step(pool: Pool, summary: dict[str, Any], step: int) -> Decision:
    """End the run after ``step`` (``run.stop_at_eval``, ``run.max_rl_seconds``): admit
    nothing more, and record it in the summary (``stopped_early_at_step``)."""
    pool.admit(False)
    summary["stopped_early_at_step"] = step
    return Decision.STOP

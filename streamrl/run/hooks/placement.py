"""Where the trainer's thread runs while RL does: pinned to its share of the cores
(``runtime.placement``), and with ``runtime.placement: auto`` moved between the two
placements by :class:`~streamrl.stream.backends.placement.AutoPlacement`, which times
the first steps of each. Every row says which placement the step ran under
(``placement/time_shared``); the summary, what auto chose and why (``placement_auto``)."""

from __future__ import annotations

from typing import Any

from streamrl.run.hooks.base import Decision, StepHook
from streamrl.run.hooks.time_sharing import Sharing
from streamrl.stream.backends.placement import AutoPlacement, Placement, available_cpus
from streamrl.stream.backends.placement import apply as apply_placement

AUTO_TIMES = ("step", "wait_batch", "update")  # what runtime.placement=auto compares


class CorePlacement(StepHook):
    def __init__(
        self, placement: Placement, sharing: Sharing, auto: AutoPlacement, summary: dict[str, Any]
    ) -> None:
        self.placement, self.sharing, self.auto, self.summary = placement, sharing, auto, summary
        self.all_cpus = tuple(available_cpus())  # before the trainer is pinned to its share

    def on_start(self) -> None:  # (the workers have started: they keep their own cores)
        apply_placement(self.placement.trainer_cpus, self.placement.trainer_threads)

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        change = self.auto.observe(*(row[f"time/{k}"] for k in AUTO_TIMES))
        if change is not None:  # runtime.placement=auto measured and chose
            self.sharing.on = change
            self.pin(shared=change)
        row["placement/time_shared"] = float(self.sharing.on)
        if self.auto.decision:
            self.summary["placement_auto"] = self.auto.decision
        return Decision.CONTINUE

    def pin(self, *, shared: bool) -> None:
        """Time-shared: the trainer takes every core; else its own share."""
        p = self.placement
        everything = self.all_cpus if p.trainer_cpus else None
        if shared:
            apply_placement(everything, len(self.all_cpus))
        else:
            apply_placement(p.trainer_cpus, p.trainer_threads)

    def on_end(self) -> None:
        apply_placement(self.all_cpus if self.placement.trainer_cpus else None, 1)

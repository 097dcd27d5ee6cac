"""Evaluation during RL: every ``eval.every`` steps (not at the last step: the final
evaluation follows the loop), and at the end of each phase of the task source
(:attr:`~streamrl.sources.base.TaskSource.phases`, e.g. offline then online data),
reported in the summary as ``eval_<metric>_after_<phase>``. Generation pauses meanwhile
where the cores are time-shared, and no worker works ahead in any case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.run.evaluation import after_summary
from streamrl.run.hooks.base import Decision, StepHook
from streamrl.run.hooks.time_sharing import Sharing
from streamrl.stream.pools import Pool


def phase_ends(phases: dict[str, int], items_per_step: int, steps: int) -> dict[int, str]:
    """{RL step: phase name} for each phase of ``phases`` ({name: items}) that ends
    before the run does."""
    ends = {-(-n // items_per_step): name for name, n in phases.items()}
    return {step: name for step, name in ends.items() if 0 < step < steps}


class Evaluation(StepHook):
    def __init__(
        self,
        evaluate: Callable[[str], dict[str, float]],
        pool: Pool,
        sharing: Sharing,
        every: int,
        last_step: int,
        phase_ends: dict[int, str],
        summary: dict[str, Any],
    ) -> None:
        self.evaluate, self.pool, self.sharing = evaluate, pool, sharing
        self.every, self.last_step, self.phase_ends = every, last_step, phase_ends
        self.summary = summary

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        phase = self.phase_ends.get(step)
        due = self.every and step % self.every == 0 and step < self.last_step
        if not (due or phase):
            return Decision.CONTINUE
        self.quiet(True)
        row.update(self.evaluate(f"after {phase}" if phase else f"step {step}"))
        self.quiet(False)
        if phase:  # summary.json: eval_return_after_<phase>
            evals = {k: v for k, v in row.items() if k.startswith("eval/")}
            self.summary.update(after_summary(evals, f"after_{phase}"))
        return Decision.CONTINUE

    def quiet(self, on: bool) -> None:
        """No work ahead while evaluating; where the cores are time-shared, no
        generation either."""
        if self.sharing.on:
            (self.pool.pause_generation if on else self.pool.resume_generation)()
        else:
            self.pool.work_ahead(not on)

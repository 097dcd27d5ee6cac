"""Placement: which cores and how many torch threads the trainer and each rollout worker get.

* ``colocated``: the engine and the trainer time-share every core. The controller
  pauses generation while it trains, so each side may use all cores in turn.
* ``disaggregated``: each rollout worker owns ``runtime.rollout_threads`` cores and
  the trainer the rest; generation runs while the trainer trains. Process and Ray
  workers are pinned to their cores (``runtime.pin_cpus``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from statistics import median

from streamrl.config import RuntimeConfig

log = logging.getLogger("streamrl.placement")


def available_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Placement:
    colocated: bool
    trainer_threads: int
    worker_threads: int
    trainer_cpus: tuple[int, ...] | None  # None: do not pin
    worker_cpus: tuple[tuple[int, ...] | None, ...]


def plan_placement(runtime: RuntimeConfig, cpus: list[int] | None = None) -> Placement:
    """The placement ``runtime.placement`` asks for, over ``cpus`` (default: this
    process's)."""
    cpus = cpus if cpus is not None else available_cpus()
    n = len(cpus)
    workers = runtime.num_rollout_workers
    if runtime.placement == "colocated":
        threads = runtime.threads or n
        return Placement(True, threads, runtime.rollout_threads or threads, None, (None,) * workers)
    if runtime.backend == "local":  # one process: torch's thread count is shared by all
        threads = runtime.threads or max(1, n // (workers + 1))
        return Placement(False, threads, threads, None, (None,) * workers)
    per_worker = runtime.rollout_threads or 1
    need = workers * per_worker
    trainer_n = runtime.threads or max(1, n - need)
    if trainer_n + need > n:
        log.warning(
            "disaggregated placement asks for %d trainer + %d x %d rollout cores but only %d "
            "are available: cores are shared (expect contention)",
            trainer_n,
            workers,
            per_worker,
            n,
        )
    # trainer on the first cores, workers on the following ones (wrapping when short)
    trainer_cpus = tuple(cpus[i % n] for i in range(trainer_n))
    worker_cpus = tuple(
        tuple(cpus[(trainer_n + w * per_worker + i) % n] for i in range(per_worker))
        for w in range(workers)
    )
    pin = runtime.pin_cpus
    return Placement(
        False,
        trainer_n,
        per_worker,
        trainer_cpus if pin else None,
        worker_cpus if pin else (None,) * workers,
    )


def apply(cpus: tuple[int, ...] | None, threads: int) -> None:
    """Pin this process to ``cpus`` (when given) and set its torch thread count."""
    import torch

    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
    torch.set_num_threads(max(1, threads))


class AutoPlacement:
    """``runtime.placement=auto``: measure, then keep whichever placement steps faster.

    The run starts disaggregated. Steps are timed from the second one on (the first
    pays for start-up). After ``probe_steps`` steps: if the trainer waited for its
    batches (median ``time/wait_batch`` at least ``wait_fraction`` of the median
    ``time/update``), generation is the bottleneck and overlap is what helps, so the
    run stays disaggregated. Otherwise the trainer is the bottleneck while the rollout
    cores idle, so the run tries time-sharing (the trainer takes every core while it
    trains, generation pauses) for ``probe_steps`` steps, one more skipped as the
    transition, and keeps it only if its median step time is lower.

    ``observe`` returns the new time-sharing flag when the placement changes.
    """

    def __init__(self, enabled: bool, probe_steps: int = 3, wait_fraction: float = 0.1):
        self.phase = "disaggregated" if enabled else "fixed"
        self.probe_steps, self.wait_fraction = probe_steps, wait_fraction
        self.seen = 0
        self.disaggregated: list[tuple[float, float, float]] = []  # (step, wait, update)
        self.timeshared: list[float] = []
        self.decision = ""

    def observe(self, step_s: float, wait_s: float, update_s: float) -> bool | None:
        self.seen += 1
        if self.phase == "disaggregated" and self.seen > 1:
            self.disaggregated.append((step_s, wait_s, update_s))
            if len(self.disaggregated) == self.probe_steps:
                waits = median(w for _, w, _ in self.disaggregated)
                updates = median(u for _, _, u in self.disaggregated)
                if waits >= self.wait_fraction * updates:
                    return self._decide(
                        None,
                        f"trainer waits {waits:.2f} s per {updates:.2f} s update: disaggregated",
                    )
                self.phase, self.seen = "timeshared", 0
                return True
        elif self.phase == "timeshared" and self.seen > 1:
            self.timeshared.append(step_s)
            if len(self.timeshared) == self.probe_steps:
                shared = median(self.timeshared)
                apart = median(s for s, _, _ in self.disaggregated)
                keep = shared < apart
                why = f"step {shared:.2f} s time-shared vs {apart:.2f} s disaggregated"
                return self._decide(
                    None if keep else False, f"{why}: {'time-shared' if keep else 'disaggregated'}"
                )
        return None

    def _decide(self, change: bool | None, decision: str) -> bool | None:
        self.phase, self.decision = "fixed", decision
        log.info("placement auto: %s", decision)
        return change

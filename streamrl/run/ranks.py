"""A run whose trainer is a rank group (``train.world_size > 1``), and the group's
restarts.

The group is started around the run: ranks 1..N-1 are spawned and rendezvous with this
process (rank 0), then the run trains (its trainer is rank 0's proxy of the sharded
engine). When a rank dies (SIGKILL, a crash) or hangs (a collective waits longer than
``train.collective_timeout_s``), rank 0's next collective fails; the whole group is torn
down and started again, and the run continues from its latest checkpoint through the
ordinary resume (:mod:`streamrl.run.resume`): torchrun's whole-group restart, bounded by
``runtime.max_trainer_restarts``. What a resume proves holds here too: every item is
consumed once (the ledger), and at eta = 0 the weights are those of an uninterrupted run.
Each restart is a line in ``run.log`` and on the console, and is counted in
``summary.json`` and every later metrics row (``train/group_restarts``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from streamrl.core.atomic import write_text
from streamrl.engines.train.group import LocalGroup, RankGroupFailed
from streamrl.engines.train.group.program import Lead
from streamrl.engines.train.group.spec import GroupSpec

RESTARTS = "train/group_restarts"
#: what torch.distributed's backends say when a peer is gone or a collective timed out
_COLLECTIVE_FAILURES = ("gloo", "nccl", "timed out", "connection closed", "connection reset")


@dataclass
class Ranks:
    """The run's rank group as the session sees it: rank 0's ``lead`` and why the group
    was restarted so far."""

    lead: Lead | None
    restarts: list[str] = field(default_factory=list)

    def record(self, summary: dict[str, Any], log: logging.Logger) -> None:
        """Count the restarts in ``summary`` and name the last one in ``run.log``."""
        summary[RESTARTS] = len(self.restarts)
        if self.restarts:
            log.warning(
                "the trainer's rank group was restarted from the latest checkpoint (%d so far): %s",
                len(self.restarts),
                self.restarts[-1],
            )


def collective_failure(error: BaseException, failure: str | None) -> str | None:
    """Why ``error`` means the rank group failed (None: it is the run's own error).
    ``failure``: which ranks exited, if any did."""
    if failure is not None:
        return failure
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen).lower()
        if isinstance(seen, RankGroupFailed | dist.DistError) or (
            isinstance(seen, RuntimeError) and any(k in text for k in _COLLECTIVE_FAILURES)
        ):
            return f"{type(seen).__name__}: {str(seen).splitlines()[0][:300]}"
        seen = seen.__cause__ or seen.__context__
    return None


def write_rank_pids(run_dir: Path, group: LocalGroup) -> None:
    """``ranks.pid``: one "rank pid" line per rank, rank 0 (this process) first (for
    operators, fault tests, and the supervisor, which kills a lost rank 0's followers)."""
    pids = {0: os.getpid(), **group.pids()}
    lines = [f"{rank} {pid}" for rank, pid in pids.items()]
    write_text(run_dir / "ranks.pid", "\n".join(lines) + "\n")


def start_local(spec: GroupSpec, run_dir: Path) -> tuple[LocalGroup, Lead]:
    """Spawn ranks 1..N-1, rendezvous, and make rank 0's lead."""
    from streamrl.engines.train.group.program import serve_rank

    group = LocalGroup(spec, serve_rank).start()
    write_rank_pids(run_dir, group)
    return group, Lead(spec)

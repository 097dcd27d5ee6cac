"""What the session puts in a checkpoint, and how a run stopped on a signal ends.

The file format, writing and reading are :mod:`streamrl.run.checkpoint`'s. Here: a
checkpoint gathers the trainer's state, the algorithm's, the random generators', the
summary so far and the stage's own state (:meth:`CheckpointState.rl_state` for RL: the
pool's books, written atomically with the ledger of item endings, and the step metrics'
totals)."""

from __future__ import annotations

import time
from typing import Any

from streamrl.algorithms import Algorithm
from streamrl.config import Config
from streamrl.engines.train.engine import TrainEngine
from streamrl.run.checkpoint import Checkpoint, rng_state, save_checkpoint
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.step_metrics import StepMetrics
from streamrl.run.tracking import RunDirectory
from streamrl.stream.pools import Pool


class CheckpointState:
    """The session's checkpoints (a part of :class:`~streamrl.run.session.Session`)."""

    cfg: Config
    run: RunDirectory
    trainer: TrainEngine
    algo: Algorithm
    summary: dict[str, Any]
    stop: GracefulStop
    t0: float  # when this process took the run over

    def elapsed(self) -> float:
        """The run's wall time so far, across resumes."""
        return self.summary["wall_time_s"] + time.time() - self.t0

    def checkpoint(self, stage: str, step: int, **state: Any) -> None:
        t0 = time.perf_counter()
        summary = {**self.summary, "wall_time_s": self.elapsed()}
        ckpt = Checkpoint(
            stage,
            step,
            self.trainer.checkpoint_state(),
            self.algo.state_dict(),
            {"rng": rng_state(), "summary": summary, **state},
            write_sharded=getattr(self.trainer, "save_sharded", None),
        )
        path = save_checkpoint(self.run.path, ckpt, self.cfg.run.keep_checkpoints)
        seconds = time.perf_counter() - t0
        self.summary["checkpoint_s_total"] = self.summary.get("checkpoint_s_total", 0.0) + seconds
        self.run.log.info("checkpoint %s (%.2fs)", path, seconds)

    def rl_state(self, pool: Pool, recorder: StepMetrics) -> dict[str, Any]:
        """The pool's books (atomically with the ledger, which is written now) and the
        step metrics' totals: the RL part of a checkpoint."""
        state, ledger = pool.checkpoint()
        self.run.write_ledger(state["trainer_version"], ledger)
        return {"pool": state, "recorder": recorder.state()}

    def interrupted(self, stage: str, step: int) -> Interrupted:
        """``summary.json`` says ``interrupted``; the error to raise says how to go on."""
        self.summary["wall_time_s"] = self.elapsed()
        self.run.finish(self.summary, status="interrupted")
        return Interrupted(
            f"interrupted during {stage} at step {step}: checkpoint written; continue with "
            f"`streamrl train --resume {self.run.path}`",
            self.stop.signum,
        )

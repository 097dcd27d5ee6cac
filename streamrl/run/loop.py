"""The RL loop: take a batch, prepare it, update, publish.

    rollout workers (any backend)           trainer (this thread)
    admit -> episodes -> stream.put   ==>   stream.get_batch -> algo.prepare
          ^                                 -> trainer.train_batch(batch, algo.loss_fn)
          '-- load weights v+1 <----------- publish weights, version v+1

Everything else a step does (placement, lending cores, evaluation, the time budget,
checkpoints, the graceful stop) is a step hook (:mod:`streamrl.run.hooks`). With
``stream.max_staleness = 0`` generation and training alternate exactly (synchronous
on-policy RL); with eta >= 1 generation of the next batches overlaps training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrl.algorithms import Algorithm
from streamrl.core.timing import StageTimer
from streamrl.run.hooks import Decision, Hooks
from streamrl.run.step_metrics import StepMetrics
from streamrl.stream.books import START_TIMEOUT_S
from streamrl.stream.pools import Pool
from streamrl.stream.sample_stream import Group, SampleStream


@dataclass
class RLLoop:
    pool: Pool
    stream: SampleStream
    trainer: Any  # a train engine: train_batch, state_dict_for_inference
    algo: Algorithm
    recorder: StepMetrics
    hooks: Hooks
    steps: int  # train.steps: the last weight version
    update: dict[str, int]  # train_batch's options: num_minibatches, epochs

    def run(self, version: int) -> tuple[int, dict[str, float]]:
        """From weight version ``version`` on; returns the last step and its row (logged
        once the final evaluation is in)."""
        last, row = self.steps, {}
        self.pool.start()
        self.hooks.on_start()
        try:
            self.pool.wait_version(version, timeout=START_TIMEOUT_S)  # every worker runs it
            for step in range(version + 1, self.steps + 1):
                row = self.step(step)
                if self.hooks.after_step(step, row) is Decision.STOP:
                    last = step
                    break
        finally:
            self.pool.stop()
            self.stream.close()
            self.hooks.on_end()
        return last, row

    def step(self, step: int) -> dict[str, float]:
        """Train weight version ``step`` and publish it; returns the step's metrics."""
        timer = StageTimer()
        with timer("step"):
            with timer("wait_batch"):
                groups = self.next_batch(step)
                self.hooks.before_update(step)
            self.algo.observe_dropped(self.pool.take_dropped())
            batch = self.algo.prepare(groups, self.trainer, timer)
            with timer("update"):
                metrics = self.trainer.train_batch(batch, self.algo.loss_fn, **self.update)
            with timer("sync"):
                if step == self.steps:  # admit nothing that no step would consume
                    self.pool.admit(False)
                self.pool.publish(self.trainer.state_dict_for_inference(), step)
                self.stream.set_trainer_version(step)
                self.hooks.after_publish(step)
        seconds = timer.seconds
        return self.recorder.row(step, groups, batch, metrics, seconds, self.stream, self.pool)

    def next_batch(self, step: int) -> list[Group]:
        """Wait for ``step``'s batch; the hooks may use the wait, or end it."""
        groups = None
        while groups is None:
            self.pool.raise_if_failed()
            groups = self.stream.get_batch(timeout=self.hooks.while_waiting(step))
        return groups

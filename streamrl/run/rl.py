"""The RL stage: set up the stream, the pool and the step hooks around the loop
(:mod:`streamrl.run.loop`), continue from a checkpoint, and balance the books at the end."""

from __future__ import annotations

import functools
from typing import Any

import torch

from streamrl.run.assembly import rollout_spec
from streamrl.run.checkpoint import Checkpoint, set_rng_state
from streamrl.run.checkpointing import CheckpointState
from streamrl.run.evaluation import Evaluator
from streamrl.run.hooks import Hooks, StepHook
from streamrl.run.hooks.checkpoints import Checkpoints
from streamrl.run.hooks.evaluation import Evaluation, phase_ends
from streamrl.run.hooks.graceful_stop import StopOnRequest
from streamrl.run.hooks.group_restarts import GroupRestarts
from streamrl.run.hooks.lending import LendCores
from streamrl.run.hooks.monitors import Monitors
from streamrl.run.hooks.placement import CorePlacement
from streamrl.run.hooks.progress import Progress, ReportProgress
from streamrl.run.hooks.stop_at_eval import StopAtEval
from streamrl.run.hooks.time_budget import TimeBudget
from streamrl.run.hooks.time_sharing import Sharing, TimeSharing
from streamrl.run.loop import RLLoop
from streamrl.run.preflight import Inputs
from streamrl.run.ranks import RESTARTS, Ranks
from streamrl.run.stages import start_stage
from streamrl.run.step_metrics import StepMetrics
from streamrl.stream.backends.placement import AutoPlacement, Placement, plan_placement
from streamrl.stream.pools import Pool, make_pool
from streamrl.stream.sample_stream import SampleStream


class RLStage(CheckpointState):
    """The session's RL stage (a part of :class:`~streamrl.run.session.Session`)."""

    inputs: Inputs
    progress: Progress | None
    tokenizer: Any
    device: str
    evaluate: Evaluator
    last_step: int
    ranks: Ranks | None = None  # the trainer's rank group (train.world_size > 1)

    def rl_stage(self, engine_model: torch.nn.Module, ckpt: Checkpoint | None) -> dict:
        """Asynchronous RL from the start, or from an RL checkpoint; returns the last
        step's row (logged once the final evaluation is in)."""
        cfg, trainer, t = self.cfg, self.trainer, self.cfg.train
        self.algo.setup(trainer, self.tokenizer)
        start_stage(trainer, t, t.steps * t.num_minibatches * t.epochs)
        version, pool_state = 0, None
        if ckpt is not None:  # continue: weights, optimizer, schedule, extra models
            trainer.load_checkpoint_state(ckpt.trainer)
            self.algo.load_state_dict(ckpt.algorithm)
            version, pool_state = ckpt.step, ckpt.state["pool"]
        placement = plan_placement(cfg.runtime)
        stream = SampleStream(
            t.items_per_step, cfg.stream.max_staleness, cfg.stream.max_inflight_items
        )
        pool = make_pool(
            cfg.endpoint,
            cfg.runtime,
            rollout_spec(cfg),
            source=self.inputs.source,
            engine_model=engine_model,
            tokenizer=self.tokenizer,
            weights=trainer.state_dict_for_inference(),
            version=version,
            stream=stream,
            placement=placement,
            drawn=pool_state["drawn"] if pool_state else 0,
            run_dir=self.run.path,
            device=self.device,
            logger=self.run.log,
        )
        recorder = StepMetrics(cfg.reward.correct_reward, cfg.rollout.group_size)
        if ckpt is not None:
            pool.restore(pool_state)
            recorder.load_state(ckpt.state["recorder"])
            set_rng_state(ckpt.state["rng"])
        elif cfg.run.checkpoint_every:  # RL's start: a resume skips SFT and the first eval
            self.checkpoint("rl", 0, **self.rl_state(pool, recorder))
        hooks = self.step_hooks(pool, stream, recorder, placement)
        update = {"num_minibatches": t.num_minibatches, "epochs": t.epochs}
        loop = RLLoop(pool, stream, trainer, self.algo, recorder, hooks, t.steps, update)
        self.last_step, row = loop.run(version)
        stream.check_accounting()
        self.run.write_ledger(t.steps, stream.drain_ledger())  # run_ended items
        self.summary.update(recorder.summary(pool, stream))
        return row

    def step_hooks(
        self, pool: Pool, stream: SampleStream, recorder: StepMetrics, placement: Placement
    ) -> Hooks:
        """Every concern of a step besides the algorithm, in the order they act."""
        cfg, steps, summary, stop = self.cfg, self.cfg.train.steps, self.summary, self.stop
        sharing = Sharing(placement.colocated)
        auto = AutoPlacement(cfg.runtime.placement == "auto")
        ends = phase_ends(self.inputs.source.phases, cfg.train.items_per_step, steps)
        books = functools.partial(self.rl_state, pool, recorder)
        hooks: list[StepHook] = [
            CorePlacement(placement, sharing, auto, summary),
            TimeSharing(pool, sharing, steps, carry_over=cfg.rollout.partial_rollouts),
            Evaluation(self.evaluate, pool, sharing, cfg.eval.every, steps, ends, summary),
            StopAtEval(pool, cfg.run.stop_at_eval, summary),
        ]
        if self.ranks is not None:
            hooks.append(GroupRestarts(RESTARTS, len(self.ranks.restarts)))
        if cfg.monitors.enabled:  # (after evaluation: it reads the step's eval/accuracy)
            weights = self.inputs.reward.weights
            correct = cfg.reward.correct_reward
            hooks.append(Monitors(cfg.monitors, weights, correct, pool, summary, self.run.log))
        budget = cfg.run.max_rl_seconds
        if budget is not None:
            hooks.append(TimeBudget(pool, budget, recorder.rl_seconds, steps, summary))
        every = cfg.run.checkpoint_every
        hooks.append(Checkpoints(books, self.run.metrics.log, self.save_rl, every, steps, stop))
        # (before lending: a stop asked for while waiting ends the wait first)
        hooks.append(StopOnRequest(stop, pool, steps, books, self.save_rl, self.rl_interrupted))
        # eta = 0 stays bit-reproducible: a step's numbers depend on its thread count
        if cfg.runtime.lend_cores and cfg.stream.max_staleness >= 1:
            threads = placement.trainer_threads + placement.worker_threads
            hooks.append(LendCores(pool, stream, stop, sharing, threads))
        if self.progress is not None:
            hooks.append(ReportProgress(self.progress, steps))
        return Hooks(hooks)

    def save_rl(self, step: int, state: dict[str, Any]) -> None:
        self.checkpoint("rl", step, **state)

    def rl_interrupted(self, step: int) -> BaseException:
        return self.interrupted("RL", step)

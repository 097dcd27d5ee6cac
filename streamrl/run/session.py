"""The training loop, top to bottom: SFT warm-start, then streaming asynchronous RL.

    rollout workers (any backend)           trainer (this thread)
    admit -> episodes -> stream.put   ==>   stream.get_batch -> algo.prepare
          ^                                 -> trainer.train_batch(batch, algo.loss_fn)
          '-- load weights v+1 <----------- publish weights, version v+1

The controller only orchestrates. What is algorithm-specific lives in the
``Algorithm`` object (:mod:`streamrl.algorithms`), how an item is rolled out in the
episode (:mod:`streamrl.rollout.episodes`), where workers run in the backend
(``runtime.backend``: the loop is the same for threads, subprocesses and Ray
actors), provenance in :class:`~streamrl.run.tracking.RunDirectory`, per-step metrics in
:class:`~streamrl.run.step_metrics.StepMetrics`, and what a checkpoint holds in
:mod:`streamrl.run.checkpoint`. With ``stream.max_staleness = 0`` generation and
training alternate exactly (synchronous on-policy RL); with eta >= 1 generation of
the next batches overlaps training.

A run survives being killed: checkpoints every ``run.checkpoint_every`` steps, at
the end of SFT, at a graceful stop (first SIGINT/SIGTERM) and at the end of the run
hold everything needed to continue, and ``run_training(..., resume=True)`` continues
from the newest readable one, bit-exactly at eta = 0; a completed run is left as it is.
The run directory is locked (:mod:`streamrl.run.lock`) while a process trains it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.algorithms import sft_loss
from streamrl.algorithms.stages import OFFLINE_STAGES, PRE_RL_STAGES, StageData, context_length
from streamrl.algorithms.stages.sft import run_sft, sft_batches
from streamrl.analysis.evaluate import EvalResult, evaluate_model
from streamrl.config.schema import Config
from streamrl.core.atomic import replacing
from streamrl.core.timing import StageTimer
from streamrl.engines.factory import batch_invariant, is_policy, make_train_engine
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.selection import build_sampler
from streamrl.run.checkpoint import Checkpoint, rng_state, save_checkpoint, set_rng_state
from streamrl.run.lock import run_lock
from streamrl.run.preflight import Inputs, preflight
from streamrl.run.resume import Found, find_resume, open_run, refinish
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.step_metrics import StepMetrics
from streamrl.run.tracking import RunDirectory, default_run_name, make_run_dir, note
from streamrl.stream.backends import RolloutPool, make_backend, plan_placement
from streamrl.stream.backends.placement import AutoPlacement, available_cpus
from streamrl.stream.backends.placement import apply as apply_placement
from streamrl.stream.pool import START_TIMEOUT_S
from streamrl.stream.sample_stream import SampleStream

Progress = Callable[[str, int, int, dict], None]


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    trainer: TrainEngine | None  # None when the trainer ran in a Ray actor
    already_completed: bool = False  # a resume found the run completed: nothing was done


AUTO_TIMES = ("step", "wait_batch", "update")  # what runtime.placement=auto compares


def set_threads(cfg: Config) -> None:
    """torch threads outside RL (SFT, evaluation): every core unless runtime.threads."""
    torch.set_num_threads(cfg.runtime.threads or max(1, len(available_cpus())))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def make_trainer(cfg: Config, model: torch.nn.Module) -> Any:
    """Full fine-tuning, or LoRA adapters when ``model.lora_rank > 0``; an environment
    policy gets its own engine (minibatch epochs, no micro-batches)."""
    kwargs: dict[str, Any] = dict(
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        micro_batch_sequences=cfg.train.micro_batch_sequences,
        device=resolve_device(cfg.runtime.device),
        keep_freed_memory=cfg.runtime.keep_freed_memory,
        batch_invariant=batch_invariant(cfg),
    )
    if cfg.train.compile:
        if is_policy(model):
            raise ValueError("train.compile applies to language models, not environment policies")
        kwargs["compile_layers"] = True
    if cfg.model.lora_rank > 0:
        return TrainEngine.from_lora(
            model,
            r=cfg.model.lora_rank,
            alpha=cfg.model.lora_alpha,
            target_modules=cfg.model.lora_targets,
            **kwargs,
        )
    return make_train_engine(model, seed=cfg.seed, **kwargs)


def reached(cfg: Config, row: dict[str, float]) -> bool:
    """Whether an evaluation in ``row`` reached ``run.stop_at_eval`` (return or accuracy)."""
    stop_at = cfg.run.stop_at_eval
    value = row.get("eval/return", row.get("eval/accuracy"))
    return stop_at is not None and value is not None and value >= stop_at


def summary_key(metric: str, when: str) -> str:
    """``eval/accuracy`` -> ``eval_accuracy_<when>``; ``eval/accuracy/math`` ->
    ``eval_accuracy_<when>/math``; ``eval/return`` -> ``eval_return_<when>``."""
    _, name, *domain = metric.split("/")
    return "/".join([f"eval_{name}_{when}", *domain])


def start_stage(trainer: TrainEngine, section: Any, optimizer_steps: int) -> None:
    """Fresh AdamW and learning-rate schedule for a stage (``cfg.sft`` or ``cfg.train``)."""
    trainer.reset_optimizer(
        section.lr,
        schedule=section.lr_schedule,
        warmup_steps=section.warmup_steps,
        total_steps=optimizer_steps,
        min_lr_ratio=section.min_lr_ratio,
    )


def run_training(
    cfg: Config,
    progress: Progress | None = None,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    stop: GracefulStop | None = None,
    lock: bool = True,
) -> RunResult:
    """Train ``cfg`` into a new run directory (``run_dir`` if given), or continue the run
    in ``run_dir`` (``resume=True``: :mod:`streamrl.run.resume` says from where, or that it
    is complete). The directory is locked throughout (``lock=False``: the caller holds
    it, e.g. the Ray driver). A run that fails after its directory exists leaves
    ``"status": "failed"``."""
    threads = torch.get_num_threads()  # restored at the end: a run leaves no global trace
    try:
        with contextlib.ExitStack() as held:
            if resume and run_dir is not None:
                if lock:
                    held.enter_context(run_lock(run_dir))
                found = find_resume(run_dir)
                if found.completed is not None or found.ended:
                    summary = found.completed or refinish(cfg, found)
                    done = found.completed is not None
                    return RunResult(run_dir, summary, None, already_completed=done)
                inputs = preflight(cfg, output_dir=False)  # before anything is written
            else:
                inputs = preflight(cfg, output_dir=True)  # before anything is written
                name = cfg.run.name or default_run_name(cfg.seed)
                run_dir = run_dir or make_run_dir(cfg.run.output_dir, name)
                run_dir.mkdir(parents=True, exist_ok=True)
                if lock:
                    held.enter_context(run_lock(run_dir))
                found = Found(run_dir)
            return _run_training(cfg, inputs, progress, found, stop)
    finally:
        torch.set_num_threads(threads)


def _run_training(
    cfg: Config, inputs: Inputs, progress: Progress | None, found: Found, stop
) -> RunResult:
    run = open_run(cfg, found)
    session = Session(cfg, inputs, run, progress, stop or GracefulStop())
    try:
        return session.main(found.ckpt)
    except Interrupted:
        raise
    except BaseException as e:
        error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        run.log.error("run failed: %s", error)
        try:
            run.finish({**session.summary, "error": error}, status="failed")
        except OSError as disk:  # e.g. the disk is full: keep the original error
            run.log.error("could not write summary.json: %s", disk)
            note(None, f"the run failed, and then: {disk}")
        raise


class Session:
    """One process's share of a run: set up, SFT, RL, wrap up, checkpoints."""

    def __init__(
        self, cfg: Config, inputs: Inputs, run: RunDirectory, progress: Progress | None, stop
    ) -> None:
        self.cfg, self.inputs, self.run, self.progress, self.stop = cfg, inputs, run, progress, stop
        self.algo = inputs.algorithm
        self.summary: dict[str, Any] = {"run_dir": str(run.path), "wall_time_s": 0.0}
        self.t0 = time.time()
        self.last_step = cfg.train.steps  # earlier with run.stop_at_eval
        # a task source's phases ({name: items}, e.g. offline then online data) end at
        # these RL steps; each end is evaluated and reported as eval_*_after_<name>
        phases = getattr(inputs.source, "phases", {})
        self.phase_ends = {
            -(-n // cfg.train.items_per_step): name
            for name, n in phases.items()
            if 0 < -(-n // cfg.train.items_per_step) < cfg.train.steps
        }

    def elapsed(self) -> float:
        return self.summary["wall_time_s"] + time.time() - self.t0

    def main(self, ckpt: Checkpoint | None) -> RunResult:
        cfg = self.cfg
        set_threads(cfg)
        seed_everything(cfg.seed)
        if ckpt is not None:
            self.summary = dict(ckpt.state["summary"])
        self.summary["sandbox/isolation"] = self.inputs.sandbox  # how model code runs
        self.device = resolve_device(cfg.runtime.device)
        source = self.inputs.source
        spaces = getattr(source, "observation_space", None), getattr(source, "action_space", None)
        model, self.tokenizer = load_model(
            cfg.model.name_or_path, gguf_file=cfg.model.gguf_file, dtype=cfg.model.dtype,
            seed=cfg.seed, spaces=spaces if spaces[0] is not None else None,
            options=cfg.model.options,
        )  # fmt: skip
        self.model = model.to(self.device)
        self.summary["model_parameters"] = model.num_parameters()
        self.eval_episode = build_episode(
            cfg, self.tokenizer, self.inputs.reward, max_new_tokens=cfg.eval.max_new_tokens
        )
        engine_model = copy.deepcopy(model).eval()  # taken before LoRA adapters are injected
        self.trainer = make_trainer(cfg, model)

        rl_ckpt = ckpt if ckpt is not None and ckpt.stage == "rl" else None
        if rl_ckpt is None:
            last_stage = self.pre_rl_stages(ckpt)
            before = self.evaluate("before RL")
            self.summary.update({summary_key(k, "before"): v for k, v in before.items()})
            if last_stage is not None:  # the model RL starts from is the last stage's
                self.summary.update(
                    {summary_key(k, f"after_{last_stage}"): v for k, v in before.items()}
                )
            self.run.metrics.log(0, before)
        last_row = self.rl_stage(engine_model, rl_ckpt)

        set_threads(cfg)
        after = self.evaluate("after RL")
        self.summary.update({summary_key(k, "after"): v for k, v in after.items()})
        self.summary.update(steps=self.last_step, wall_time_s=self.elapsed())
        last_row.update(after)
        self.run.metrics.log(self.last_step, last_row)
        if cfg.run.save_weights:  # replaced whole, or not at all
            with replacing(self.run.path / "model", directory=True) as model_dir:
                self.trainer.save(model_dir, tokenizer=self.tokenizer)
        self.checkpoint("done", self.last_step)  # the final state: a resume finds it done
        self.run.finish(self.summary)
        return RunResult(run_dir=self.run.path, summary=self.summary, trainer=self.trainer)

    def evaluate(self, tag: str, *, sampled: bool = True) -> dict[str, float]:
        """``eval/accuracy`` on the held-out items, and ``eval/accuracy/<domain>``; for an
        environment, ``eval/return``: the mean return of deterministic episodes. For a
        language task with ``eval.samples`` = n > 0 also ``eval/sampled_accuracy``: the
        mean correctness of n samples per item at the rollout temperature."""
        res = self.evaluate_heldout(greedy=True)
        if "return_mean" in res.metrics:
            self.run.log.info("eval %s: mean return %.2f", tag, res.metrics["return_mean"])
            return {"eval/return": res.metrics["return_mean"]}
        self.run.log.info("eval %s: accuracy %.4f on %d items", tag, res.accuracy, len(res.items))
        domains = {k: v for k, v in res.metrics.items() if k.startswith("accuracy/")}
        row = {"eval/accuracy": res.accuracy, **{f"eval/{k}": v for k, v in domains.items()}}
        if sampled and self.cfg.eval.samples:
            sampled = self.evaluate_heldout(greedy=False)  # avg@1 over n > 1 samples
            row["eval/sampled_accuracy"] = sampled.metrics.get("avg@1", sampled.accuracy)
            self.run.log.info(
                "eval %s: sampled accuracy %.4f (%d samples per item)",
                tag, row["eval/sampled_accuracy"], self.cfg.eval.samples,
            )  # fmt: skip
        return row

    def evaluate_heldout(self, *, greedy: bool) -> EvalResult:
        """The held-out items through the evaluation episode: one greedy sample each, or
        ``eval.samples`` samples at the rollout temperature."""
        return evaluate_model(
            self.model,
            self.tokenizer,
            self.eval_episode,
            self.inputs.heldout,
            self.cfg.reward.correct_reward,
            device=self.device,
            greedy=greedy,
            samples_per_item=self.cfg.eval.samples,
            seed=self.cfg.seed,
        )

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, stage: str, step: int, **state: Any) -> None:
        t0 = time.perf_counter()
        summary = {**self.summary, "wall_time_s": self.elapsed()}
        ckpt = Checkpoint(
            stage,
            step,
            self.trainer.checkpoint_state(),
            self.algo.state_dict(),
            {"rng": rng_state(), "summary": summary, **state},
        )
        path = save_checkpoint(self.run.path, ckpt, self.cfg.run.keep_checkpoints)
        seconds = time.perf_counter() - t0
        self.summary["checkpoint_s_total"] = self.summary.get("checkpoint_s_total", 0.0) + seconds
        self.run.log.info("checkpoint %s (%.2fs)", path, seconds)

    def interrupted(self, stage: str, step: int) -> Interrupted:
        self.summary["wall_time_s"] = self.elapsed()
        self.run.finish(self.summary, status="interrupted")
        return Interrupted(
            f"interrupted during {stage} at step {step}: checkpoint written; continue with "
            f"`streamrl train --resume {self.run.path}`",
            self.stop.signum,
        )

    # ------------------------------------------------------------ stages

    def pre_rl_stages(self, ckpt: Checkpoint | None) -> str | None:
        """SFT, DPO, A-LoL in this order, each when its ``steps`` > 0. A checkpoint written
        inside one continues it and skips those before it. The held-out accuracy after each
        stage but the last (whose is the evaluation before RL) goes into the summary as
        ``eval_<metric>_after_<stage>``. Returns the last stage run, if any."""
        names = [s for s in PRE_RL_STAGES if getattr(self.cfg, s).steps > 0]
        if ckpt is not None:
            names = names[names.index(ckpt.stage) :]
        for k, name in enumerate(names):
            self.train_stage(name, ckpt if ckpt is not None and ckpt.stage == name else None)
            if k < len(names) - 1:
                after = self.evaluate(f"after {name}")
                self.summary.update({summary_key(m, f"after_{name}"): v for m, v in after.items()})
        return names[-1] if names else None

    def stage_data(self, name: str) -> StageData:
        """The batches, loss and extra models of pre-RL stage ``name``."""
        cfg = self.cfg
        if name != "sft":
            return OFFLINE_STAGES[name](
                cfg, self.tokenizer, self.trainer, context_length(self.model)
            )
        episode = build_episode(cfg, self.tokenizer, self.inputs.reward)
        batches = sft_batches(
            self.tokenizer,
            self.inputs.source.train_iter(cfg.seed + 1),
            cfg.sft.examples_per_step,
            cfg.sft.corrupt_fraction,
            cfg.seed,
            replay=getattr(episode, "replay", None),  # multi-turn teacher traces
        )
        return StageData(batches, sft_loss)

    def train_stage(self, name: str, ckpt: Checkpoint | None) -> None:
        """``cfg.<name>.steps`` optimizer steps of a pre-RL stage (SFT on the task's
        demonstrations, DPO, A-LoL), continued from a checkpoint of it: the batch stream
        skips the batches already trained on, and the stage's reference is restored."""
        cfg, trainer = self.cfg, self.trainer
        section = getattr(cfg, name)
        start_stage(trainer, section, section.steps)
        stage = self.stage_data(name)  # a reference is taken from the policy here
        for key, value in (stage.summary or {}).items():
            self.summary[f"{name}/{key}"] = value
        start = 0
        if ckpt is not None:
            trainer.load_checkpoint_state(ckpt.trainer)
            stage.load_state_dict(ckpt.state.get("stage_models", {}))
            if ckpt.state.get("stage_done"):  # it ended at its evaluation threshold
                set_rng_state(ckpt.state["rng"])
                return
            start = ckpt.step
            for _ in range(start):
                next(stage.batches)
            set_rng_state(ckpt.state["rng"])
        eval_every = getattr(section, "eval_every", 0)
        stop_at = getattr(section, "stop_at_eval", None)
        reached: list[int] = []

        def on_step(step: int, m: dict) -> bool:
            every, done = cfg.run.checkpoint_every, step + 1
            if eval_every and done % eval_every == 0:
                m = {**m, **self.evaluate(f"{name} step {done}", sampled=False)}
                if stop_at is not None and m["eval/accuracy"] >= stop_at:
                    reached.append(done)
            self.run.metrics.log_aux(name, step, m)
            if self.progress:
                self.progress(name, step + 1, section.steps, m)
            if reached:
                return True
            if every and done % every == 0 and done < section.steps and not self.stop.requested:
                self.checkpoint(name, done, stage_models=stage.state_dict())
            return self.stop.requested

        timer = StageTimer()
        with timer(name):
            done, last = run_sft(
                trainer, stage.batches, section.steps, stage.loss_fn, on_step, start, stage.prepare
            )
        seconds = timer.seconds[f"time/{name}"]
        self.summary[f"{name}_time_s"] = self.summary.get(f"{name}_time_s", 0.0) + seconds
        self.summary[f"{name}_final_loss"] = last.get("loss")
        self.summary[f"{name}_steps_done"] = done
        self.checkpoint(name, done, stage_models=stage.state_dict(), stage_done=bool(reached))
        if reached:
            self.run.log.info(
                "%s: held-out accuracy reached %s at step %d; on to the next stage",
                name, stop_at, done,
            )  # fmt: skip
        elif done < section.steps:
            raise self.interrupted(name.upper(), done)

    def rl_stage(self, engine_model: torch.nn.Module, ckpt: Checkpoint | None) -> dict:
        cfg, trainer = self.cfg, self.trainer
        self.algo.setup(trainer, self.tokenizer)
        t = cfg.train
        start_stage(trainer, t, t.steps * t.num_minibatches * t.epochs)
        version, pool_state = 0, None
        if ckpt is not None:  # continue: weights, optimizer, schedule, extra models
            trainer.load_checkpoint_state(ckpt.trainer)
            self.algo.load_state_dict(ckpt.algorithm)
            version, pool_state = ckpt.step, ckpt.state["pool"]
        placement = plan_placement(cfg)
        weights = trainer.state_dict_for_inference()
        stream = SampleStream(
            cfg.train.items_per_step, cfg.stream.max_staleness, cfg.stream.max_inflight_items
        )
        pool = self.make_pool(engine_model, weights, version, stream, placement, pool_state)
        recorder = StepMetrics(cfg.reward.correct_reward, cfg.rollout.group_size)
        if ckpt is not None:
            pool.restore(pool_state)
            recorder.load_state(ckpt.state["recorder"])
            set_rng_state(ckpt.state["rng"])
        elif cfg.run.checkpoint_every:  # RL's start: a resume skips SFT and the first eval
            self.checkpoint("rl", 0, **self._rl_state(pool, recorder))
        row = self.rl_loop(pool, stream, placement, recorder, version)
        stream.check_accounting()
        self.run.write_ledger(cfg.train.steps, stream.drain_ledger())  # run_ended items
        self.summary.update(recorder.summary(pool, stream))
        return row

    def make_pool(self, engine_model, weights, version, stream, placement, pool_state) -> Any:
        """Who drives the episodes: rollout workers on the configured backend, or external
        agents through the HTTP endpoint (``streamrl serve``)."""
        cfg = self.cfg
        if cfg.endpoint.enabled:
            from streamrl.stream.endpoint.pool import EndpointPool

            return EndpointPool(
                cfg, engine_model, self.tokenizer, weights, version, stream, self.run.path,
                device=self.device, logger=self.run.log,
            )  # fmt: skip
        backend = make_backend(
            cfg, placement, engine_model, self.tokenizer, weights, self.device, version
        )
        drawn = pool_state["drawn"] if pool_state else 0
        return RolloutPool(
            backend,
            stream,
            itertools.islice(self.inputs.source.train_iter(cfg.seed), drawn, None),
            max_restarts=cfg.runtime.max_worker_restarts,
            worker_timeout_s=cfg.runtime.worker_timeout_s,
            max_consecutive_failures=cfg.rollout.max_consecutive_failures,
            max_dropped_in_a_row=cfg.algorithm.max_dropped_in_a_row,
            logger=self.run.log,
            sampler=build_sampler(cfg.selection, cfg.rollout, cfg.seed),
        )

    def rl_loop(
        self,
        pool: Any,
        stream: SampleStream,
        placement: Any,
        recorder: StepMetrics,
        version: int,
    ) -> dict[str, float]:
        """Asynchronous RL from weight version ``version``: take a batch, prepare it,
        update, publish. Returns the last row (logged once the final evaluation is in)."""
        cfg, trainer, algo, run = self.cfg, self.trainer, self.algo, self.run
        colocated, partial = placement.colocated, cfg.rollout.partial_rollouts
        auto = AutoPlacement(cfg.runtime.placement == "auto")
        # eta = 0 stays bit-reproducible: a step's numbers depend on its thread count
        lend_cores = cfg.runtime.lend_cores and cfg.stream.max_staleness >= 1
        lent = placement.trainer_threads + placement.worker_threads
        steps, row = cfg.train.steps, {}
        all_cpus = tuple(available_cpus())  # before the trainer is pinned to its share
        pool.start()
        apply_placement(placement.trainer_cpus, placement.trainer_threads)
        try:
            pool.wait_version(version, timeout=START_TIMEOUT_S)  # every worker runs it
            for step in range(version + 1, steps + 1):
                timer = StageTimer()
                with timer("step"):
                    with timer("wait_batch"):
                        groups = None
                        while groups is None and not self.stop.requested:
                            pool.raise_if_failed()
                            lending = lend_cores and not colocated
                            drove = lending and pool.drive_engines(
                                lent, lambda: stream.has_batch() or self.stop.requested
                            )  # the trainer's thread steps the engine on every core
                            # where driving applies, drive again as soon as work comes;
                            # where it does not (yet: steps not measured), look in 0.1 s
                            wait = 0.005 if drove else 0.1 if lending else 1.0
                            groups = stream.get_batch(timeout=wait)
                        if groups is None:  # a graceful stop: checkpoint at step - 1
                            pool.hold(True)
                            self.checkpoint("rl", step - 1, **self._rl_state(pool, recorder))
                            raise self.interrupted("RL", step - 1)
                        if colocated:  # time-share the cores: generation stops while we train
                            if not partial:  # nothing may be carried over: finish them all
                                pool.hold(True)
                                pool.drain()
                            pool.pause()
                    batch = algo.prepare(groups, trainer, timer)
                    with timer("update"):
                        train_metrics = trainer.train_batch(
                            batch,
                            algo.loss_fn,
                            num_minibatches=cfg.train.num_minibatches,
                            epochs=cfg.train.epochs,
                        )
                    with timer("sync"):
                        if step == steps:  # admit nothing that no step would consume
                            pool.hold(True)
                        pool.publish(trainer.state_dict_for_inference(), step)
                        stream.set_trainer_version(step)
                        if colocated and step < steps:
                            pool.hold(False)
                            pool.resume()
                row = recorder.row(step, groups, batch, train_metrics, timer.seconds, stream, pool)
                change = auto.observe(*(timer.seconds[f"time/{k}"] for k in AUTO_TIMES))
                if change is not None:  # runtime.placement=auto measured and chose
                    colocated = change
                    everything = all_cpus if placement.trainer_cpus else None
                    apply_placement(
                        everything if colocated else placement.trainer_cpus,
                        len(all_cpus) if colocated else placement.trainer_threads,
                    )
                row["placement/time_shared"] = float(colocated)
                if auto.decision:
                    self.summary["placement_auto"] = auto.decision
                phase = self.phase_ends.get(step)  # e.g. the end of offline pre-training
                if (cfg.eval.every and step % cfg.eval.every == 0 and step < steps) or phase:
                    pool.pause(engines=colocated)  # and no scoring ahead while evaluating
                    row.update(self.evaluate(f"after {phase}" if phase else f"step {step}"))
                    pool.resume(engines=colocated)
                    if phase:  # summary.json: eval_return_after_<phase>
                        ev = {k: v for k, v in row.items() if k.startswith("eval/")}
                        self.summary.update(
                            {summary_key(k, f"after_{phase}"): v for k, v in ev.items()}
                        )
                budget = cfg.run.max_rl_seconds
                spent = budget is not None and step < steps and recorder.rl_seconds() >= budget
                if reached(cfg, row) or spent:  # run.stop_at_eval or run.max_rl_seconds
                    pool.hold(True)  # this is the last step
                    self.summary["stopped_early_at_step"] = self.last_step = step
                    break
                state = self._rl_state(pool, recorder)  # drains the ledger: write it first
                if step < steps:  # the last row waits for the final evaluation
                    run.metrics.log(step, row)
                    every = cfg.run.checkpoint_every
                    if (every and step % every == 0) or self.stop.requested:
                        self.checkpoint("rl", step, **state)
                    if self.stop.requested:
                        pool.hold(True)
                        raise self.interrupted("RL", step)
                if self.progress:
                    self.progress("rl", step, steps, row)
        finally:
            pool.stop()
            stream.close()
            apply_placement(all_cpus if placement.trainer_cpus else None, 1)
        return row

    def _rl_state(self, pool: Any, recorder: StepMetrics) -> dict[str, Any]:
        """The pool's books (atomically with the ledger, which is written now) and the
        step metrics' totals: the RL part of a checkpoint."""
        state, ledger = pool.checkpoint()
        self.run.write_ledger(state["trainer_version"], ledger)
        return {"pool": state, "recorder": recorder.state()}

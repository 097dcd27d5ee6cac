"""One process's share of a run, top to bottom: set up, the stages before RL (SFT, DPO,
A-LoL), streaming asynchronous RL, wrap up.

The session only orchestrates. What is algorithm-specific lives in the ``Algorithm``
object (:mod:`streamrl.algorithms`), how an item is rolled out in the episode
(:mod:`streamrl.rollout.episodes`), who produces the groups in the pool
(:mod:`streamrl.stream.pools`: rollout workers on any backend, or external agents), the
RL loop and its step hooks in :mod:`streamrl.run.loop` and :mod:`streamrl.run.hooks`,
the stages before RL in :mod:`streamrl.run.stages`, evaluation in
:mod:`streamrl.run.evaluation`, provenance in :class:`~streamrl.run.tracking.RunDirectory`,
and what a checkpoint holds in :mod:`streamrl.run.checkpointing`.

A run survives being killed: checkpoints every ``run.checkpoint_every`` steps, at
the end of SFT, at a graceful stop (first SIGINT/SIGTERM) and at the end of the run
hold everything needed to continue, and ``run_training(..., resume=True)`` continues
from the newest readable one, bit-exactly at eta = 0; a completed run is left as it is.
The run directory is locked (:mod:`streamrl.run.lock`) while a process trains it.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.config import Config
from streamrl.core.atomic import replacing
from streamrl.engines.factory import batch_invariant, make_train_engine
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.group.build import build_sharded_trainer
from streamrl.engines.train.group.program import Lead
from streamrl.models import load_model
from streamrl.rollout.episodes import build_episode
from streamrl.run.assembly import episode_spec
from streamrl.run.checkpoint import Checkpoint
from streamrl.run.evaluation import Evaluator, after_summary
from streamrl.run.hooks.monitors import final_status
from streamrl.run.hooks.progress import Progress
from streamrl.run.lock import run_lock
from streamrl.run.preflight import Inputs, preflight
from streamrl.run.ranks import Ranks
from streamrl.run.resume import Found, find_resume, open_run, refinish
from streamrl.run.rl import RLStage
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.stages import PreRLStages
from streamrl.run.tracking import RunDirectory, default_run_name, make_run_dir, note
from streamrl.stream.backends.placement import available_cpus

__all__ = ["Progress", "RunResult", "Session", "make_trainer", "run_training"]


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    trainer: TrainEngine | None  # None when the trainer ran in a Ray actor
    already_completed: bool = False  # a resume found the run completed: nothing was done


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


def make_trainer(cfg: Config, model: torch.nn.Module, lead: Lead | None = None) -> Any:
    """Full fine-tuning, or LoRA adapters when ``model.lora_rank > 0``; an environment
    policy gets its own engine (minibatch epochs, no micro-batches). Preflight checked the
    settings (``train.compile`` and LoRA are a language model's). With a rank group's
    ``lead`` (``train.world_size > 1``): the sharded engine on every rank, and rank 0's
    proxy of it."""
    kwargs: dict[str, Any] = dict(
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        micro_batch_sequences=cfg.train.micro_batch_sequences,
        device=resolve_device(cfg.runtime.device),
        keep_freed_memory=cfg.runtime.keep_freed_memory,
        batch_invariant=batch_invariant(cfg.rollout, cfg.stream.max_staleness),
    )
    if cfg.train.compile:
        kwargs["compile_layers"] = True
    if lead is not None:
        kwargs["reshard_after_forward"] = cfg.train.reshard_after_forward
        kwargs["accumulate_unsharded"] = not cfg.train.reshard_after_forward
        return lead.build(build_sharded_trainer, cfg.model, cfg.seed, kwargs, here={"model": model})
    if cfg.model.lora_rank > 0:
        return TrainEngine.from_lora(
            model,
            r=cfg.model.lora_rank,
            alpha=cfg.model.lora_alpha,
            target_modules=cfg.model.lora_targets,
            **kwargs,
        )
    return make_train_engine(model, seed=cfg.seed, **kwargs)


def run_training(
    cfg: Config,
    progress: Progress | None = None,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    stop: GracefulStop | None = None,
    lock: bool = True,
    ranks: Ranks | None = None,
) -> RunResult:
    """Train ``cfg`` into a new run directory (``run_dir`` if given), or continue the run
    in ``run_dir`` (``resume=True``: :mod:`streamrl.run.resume` says from where, or that it
    is complete). The directory is locked throughout (``lock=False``: the caller holds
    it, e.g. the Ray driver). A run that fails after its directory exists leaves
    ``"status": "failed"``. ``ranks``: the trainer's rank group (``train.world_size > 1``)
    and its restarts so far."""
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
            return _run_training(cfg, inputs, progress, found, stop, ranks)
    finally:
        torch.set_num_threads(threads)


def _run_training(
    cfg: Config, inputs: Inputs, progress: Progress | None, found: Found, stop, ranks
) -> RunResult:
    run = open_run(cfg, found)
    session = Session(cfg, inputs, run, progress, stop or GracefulStop(), ranks)
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


class Session(PreRLStages, RLStage):
    """One process's share of a run: set up, the stages before RL, RL, wrap up."""

    def __init__(
        self,
        cfg: Config,
        inputs: Inputs,
        run: RunDirectory,
        progress: Progress | None,
        stop: GracefulStop,
        ranks: Ranks | None = None,
    ) -> None:
        self.cfg, self.inputs, self.run, self.progress, self.stop = cfg, inputs, run, progress, stop
        self.ranks = ranks
        self.algo = inputs.algorithm
        self.summary: dict[str, Any] = {"run_dir": str(run.path), "wall_time_s": 0.0}
        self.t0 = time.time()
        self.last_step = cfg.train.steps  # earlier with run.stop_at_eval or run.max_rl_seconds

    def main(self, ckpt: Checkpoint | None) -> RunResult:
        engine_model = self.set_up(ckpt)
        rl_ckpt = ckpt if ckpt is not None and ckpt.stage == "rl" else None
        if rl_ckpt is None:
            self.before_rl(ckpt)
        last_row = self.rl_stage(engine_model, rl_ckpt)
        return self.wrap_up(last_row)

    def set_up(self, ckpt: Checkpoint | None) -> torch.nn.Module:
        """The model, its trainer and the evaluation; returns the rollout engines' copy
        of the model (taken before LoRA adapters are injected)."""
        cfg = self.cfg
        set_threads(cfg)
        seed_everything(cfg.seed)
        if ckpt is not None:
            self.summary = dict(ckpt.state["summary"])
        if self.ranks is not None:
            self.ranks.record(self.summary, self.run.log)
        self.summary["sandbox/isolation"] = self.inputs.sandbox  # how model code runs
        self.device = resolve_device(cfg.runtime.device)
        model, self.tokenizer = load_model(
            cfg.model.name_or_path,
            gguf_file=cfg.model.gguf_file,
            dtype=cfg.model.dtype,
            seed=cfg.seed,
            spaces=self.inputs.source.spaces(),
            options={**cfg.model.options, **self.inputs.source.policy_options()},
        )
        self.model = model.to(self.device)
        self.summary["model_parameters"] = model.num_parameters()
        spec = episode_spec(cfg)
        episode = build_episode(
            spec, self.tokenizer, self.inputs.reward, max_new_tokens=cfg.eval.max_new_tokens
        )
        engine_model = copy.deepcopy(model).eval()
        lead = self.ranks.lead if self.ranks is not None else None
        if lead is not None:  # the trainer's model is sharded: evaluate a full copy
            self.model = copy.deepcopy(model).eval()
        self.trainer = make_trainer(cfg, model, lead)
        weights = self.trainer.state_dict_for_inference if lead is not None else None
        self.evaluate = Evaluator(
            cfg, self.model, self.tokenizer, episode, self.inputs.heldout, self.device, self.run.log
        )
        self.evaluate.weights = weights
        return engine_model

    def before_rl(self, ckpt: Checkpoint | None) -> None:
        """The stages before RL (continued from ``ckpt``, one of theirs), and the
        evaluation of the model RL starts from."""
        last_stage = self.pre_rl_stages(ckpt)
        before = self.evaluate("before RL")
        self.summary.update(after_summary(before, "before"))
        if last_stage is not None:  # the model RL starts from is the last stage's
            self.summary.update(after_summary(before, f"after_{last_stage}"))
        self.run.metrics.log(0, before)

    def wrap_up(self, last_row: dict[str, float]) -> RunResult:
        """The final evaluation, the last row, the weights, the final checkpoint and
        ``summary.json``."""
        set_threads(self.cfg)
        after = self.evaluate("after RL")
        self.summary.update(after_summary(after, "after"))
        self.summary.update(steps=self.last_step, wall_time_s=self.elapsed())
        last_row.update(after)
        self.run.metrics.log(self.last_step, last_row)
        if self.cfg.run.save_weights:  # replaced whole, or not at all
            with replacing(self.run.path / "model", directory=True) as model_dir:
                self.trainer.save(model_dir, tokenizer=self.tokenizer)
        self.checkpoint("done", self.last_step)  # the final state: a resume finds it done
        self.run.finish(self.summary, status=final_status(self.summary))
        return RunResult(run_dir=self.run.path, summary=self.summary, trainer=self.trainer)

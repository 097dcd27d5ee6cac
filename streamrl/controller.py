"""The training loop, top to bottom: SFT warm-start, then streaming asynchronous RL.

    rollout workers (any backend)           trainer (this thread)
    admit -> episodes -> stream.put   ==>   stream.get_batch -> advantages
          ^                                 -> proximal logprobs -> update
          '-- load weights v+1 <----------- publish weights, version v+1

The workers are threads, subprocesses or Ray actors (``runtime.backend``); the
loop below is the same for all of them, only the backend object changes. With
``stream.max_staleness = 0`` generation and training alternate exactly
(synchronous on-policy RL); with eta >= 1 generation of the next batches overlaps
training (disaggregated placement), or pauses during training and carries its
unfinished sequences over (colocated placement with partial rollouts).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from streamrl.algorithms import PolicyLossParams, get_advantage, make_rl_loss_fn, sft_loss
from streamrl.backends import (
    RolloutPool,
    build_reward,
    make_backend,
    plan_placement,
    sampling_params,
)
from streamrl.backends.placement import apply as apply_placement
from streamrl.backends.placement import available_cpus
from streamrl.backends.pool import START_TIMEOUT_S
from streamrl.config import Config, save_config
from streamrl.data import build_task_source
from streamrl.engines.train import TrainEngine
from streamrl.eval.evaluate import evaluate
from streamrl.models import load_model_and_tokenizer
from streamrl.sft import run_sft, sft_batches
from streamrl.sinks import build_sinks
from streamrl.stream import Group, SampleStream, carried_metrics, staleness_metrics
from streamrl.tracking import (
    MetricsLogger,
    git_commit,
    machine_info,
    make_run_dir,
    package_versions,
    setup_run_log,
    write_json,
)
from streamrl.types import Batch, SamplingParams


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    trainer: TrainEngine | None  # None when the trainer ran in a Ray actor


@contextmanager
def stage(timings: dict[str, float], name: str):
    """Name and time one stage of the loop; shows up as ``time/<name>``."""
    t0 = time.perf_counter()
    yield
    timings[f"time/{name}"] = timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0


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


def build_batch(groups: list[Group], cfg: Config, pad_id: int) -> Batch:
    """Collate groups and attach per-token advantages from the registered estimator."""
    trajectories = [t for g in groups for t in g.trajectories]
    batch = Batch.collate(trajectories, pad_id=pad_id)
    baseline = None
    if "baseline_reward" in trajectories[0].metadata:
        baseline = torch.tensor([t.metadata["baseline_reward"] for t in trajectories])
    advantages = get_advantage(cfg.algorithm.advantage)(
        batch.rewards, batch.group_ids, baseline=baseline
    )
    batch.advantages = advantages[:, None] * batch.loss_mask  # (N,) -> (N, T)
    return batch


def rl_loss_fn(cfg: Config):
    a = cfg.algorithm
    params = PolicyLossParams(
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        agg_mode=a.agg_mode,
        max_tokens=cfg.rollout.max_new_tokens,
        behave_imp_weight_cap=a.behave_imp_weight_cap,
    )
    return make_rl_loss_fn(
        a.policy_loss,
        params,
        kl_coef=a.kl_coef,
        kl_kind=a.kl_kind,
        entropy_coef=a.entropy_coef,
        proximal_from_current=a.decoupled and cfg.train.num_minibatches == 1,
    )


def rl_step(
    trainer: TrainEngine,
    groups: list[Group],
    cfg: Config,
    loss_fn,
    pad_id: int,
    timings: dict[str, float],
    ref_model=None,
) -> dict[str, float]:
    """One RL update from a list of groups (shared by the async loop and tests)."""
    with stage(timings, "advantage"):
        batch = build_batch(groups, cfg, pad_id)
    if cfg.algorithm.kl_coef > 0 and ref_model is not None:
        with stage(timings, "ref_logprob"):
            batch.ref_logprobs = trainer.compute_logprobs(batch, model=ref_model)
    if cfg.algorithm.decoupled and cfg.train.num_minibatches > 1:
        # several optimizer steps per batch: freeze the proximal policy first
        # (with one step, the loss takes it from the training forward itself)
        with stage(timings, "logprob"):
            batch.proximal_logprobs = trainer.compute_logprobs(batch)
    with stage(timings, "update"):
        metrics = trainer.train_batch(batch, loss_fn, num_minibatches=cfg.train.num_minibatches)
    mask = batch.loss_mask
    metrics["reward_mean"] = float(batch.rewards.mean())
    metrics["reward_std"] = float(batch.rewards.std()) if batch.size > 1 else 0.0
    metrics["response_length"] = float(mask.sum(1).float().mean())
    return metrics


def make_trainer(cfg: Config, model: torch.nn.Module, lr: float) -> TrainEngine:
    """Full fine-tuning, or LoRA adapters when ``model.lora_rank > 0``."""
    kwargs = dict(
        lr=lr,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        micro_batch_size=cfg.train.micro_batch_size,
        device=resolve_device(cfg.runtime.device),
    )
    if cfg.model.lora_rank > 0:
        return TrainEngine.from_lora(
            model, r=cfg.model.lora_rank, alpha=cfg.model.lora_alpha, **kwargs
        )
    return TrainEngine(model, **kwargs)


def train(cfg: Config, progress: Callable | None = None) -> RunResult:
    """Run ``cfg``; with ``runtime.backend=ray`` the loop itself runs in a Ray actor."""
    if cfg.runtime.backend == "ray":
        from streamrl.backends.ray_actors import run_on_ray

        placement = plan_placement(cfg)
        return run_on_ray(cfg, trainer_cpus=1 if placement.colocated else placement.trainer_threads)
    return run_training(cfg, progress)


def run_training(cfg: Config, progress: Callable | None = None) -> RunResult:
    # ---------------------------------------------------------------- set-up
    set_threads(cfg)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.runtime.device)
    # inputs first: a malformed data file fails before anything is written
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    reward = build_reward(cfg.reward)
    heldout = source.heldout(cfg.eval.heldout_size)
    name = cfg.run.name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-s{cfg.seed}"
    run_dir = make_run_dir(cfg.run.output_dir, name)
    save_config(cfg, run_dir / "config.yaml")
    write_json(
        run_dir / "environment.json",
        {
            "packages": package_versions(),
            "git_commit": git_commit(Path(__file__).parent),
            "machine": machine_info(),
            "seed": cfg.seed,
            "argv": os.environ.get("STREAMRL_ARGV", ""),
        },
    )
    log = setup_run_log(run_dir)
    sinks = build_sinks(cfg, run_dir)  # W&B / MLflow when run.wandb / run.mlflow
    metrics_log = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, sinks=sinks)

    model, tokenizer = load_model_and_tokenizer(
        cfg.model.name_or_path, gguf_file=cfg.model.gguf_file, dtype=cfg.model.dtype, seed=cfg.seed
    )
    model.to(device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eval_params = SamplingParams(
        temperature=0.0,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        stop=list(cfg.rollout.stop),
        stop_token_ids=sampling_params(cfg, tokenizer).stop_token_ids,
    )

    def run_eval(tag: str) -> float:
        res = evaluate(
            model, tokenizer, heldout, reward, cfg.reward.correct_reward, eval_params, device=device
        )
        log.info("eval %s: accuracy %.4f on %d items", tag, res.accuracy, len(heldout))
        return res.accuracy

    summary: dict = {"run_dir": str(run_dir), "model_parameters": model.num_parameters()}
    t_start = time.time()

    # the engine's own copy, taken before any LoRA adapter is injected into `model`
    engine_model = copy.deepcopy(model).eval()
    trainer = make_trainer(cfg, model, lr=cfg.sft.lr if cfg.sft.steps else cfg.train.lr)

    # ---------------------------------------------------------------- SFT
    if cfg.sft.steps > 0:
        batches = sft_batches(
            tokenizer,
            source.train_iter(cfg.seed + 1),
            cfg.sft.batch_size,
            cfg.sft.corrupt_fraction,
            cfg.seed,
        )

        def on_sft_step(step: int, m: dict) -> None:
            metrics_log.log_aux("sft", step, m)
            if progress:
                progress("sft", step + 1, cfg.sft.steps, m)

        t0 = time.time()
        last = run_sft(trainer, batches, cfg.sft.steps, sft_loss, on_sft_step)
        summary["sft_time_s"] = time.time() - t0
        summary["sft_final_loss"] = last.get("loss")
        trainer.reset_optimizer(lr=cfg.train.lr)  # fresh AdamW state for RL

    summary["eval_accuracy_before"] = run_eval("before RL")
    metrics_log.log(0, {"eval/accuracy": summary["eval_accuracy_before"]})

    # ---------------------------------------------------------------- RL
    ref_model = copy.deepcopy(engine_model) if cfg.algorithm.kl_coef > 0 else None
    weights = trainer.state_dict_for_inference()  # the SFT checkpoint is version 0
    if ref_model is not None:
        ref_model.load_state_dict(weights)
    placement = plan_placement(cfg)
    backend = make_backend(cfg, placement, engine_model, tokenizer, weights, device)
    stream = SampleStream(
        cfg.train.batch_size, cfg.stream.max_staleness, cfg.stream.max_inflight_groups
    )
    pool = RolloutPool(
        backend,
        stream,
        source.train_iter(cfg.seed),
        max_restarts=cfg.runtime.max_worker_restarts,
        worker_timeout_s=cfg.runtime.worker_timeout_s,
        logger=log,
    )
    loss_fn = rl_loss_fn(cfg)
    colocated, partial = placement.colocated, cfg.rollout.partial_rollouts
    all_cpus = available_cpus()

    pool.start()
    apply_placement(placement.trainer_cpus, placement.trainer_threads)
    t_rl = time.time()
    tokens_total, carried_total, waited = 0, 0, 0.0
    last_row: dict[str, float] = {}
    try:
        pool.wait_version(0, timeout=START_TIMEOUT_S)  # every worker runs the SFT weights
        for step in range(cfg.train.steps):
            timings: dict[str, float] = {}
            t_step = time.perf_counter()
            with stage(timings, "wait_batch"):
                groups = None
                while groups is None:
                    pool.raise_if_failed()
                    groups = stream.get_batch(timeout=1.0)
                if colocated:  # time-share the cores: generation stops while we train
                    if not partial:
                        pool.hold(True)
                        pool.drain()
                    pool.pause()
            lag = staleness_metrics(groups, stream.trainer_version)
            metrics = rl_step(trainer, groups, cfg, loss_fn, pad_id, timings, ref_model)
            last = step + 1 == cfg.train.steps
            with stage(timings, "sync"):
                if last:  # admit nothing that no step would consume
                    pool.hold(True)
                pool.publish(trainer.state_dict_for_inference(), step + 1)
                stream.set_trainer_version(step + 1)
                if colocated and not last:
                    pool.hold(False)
                    pool.resume()
            correct = [
                (t.metadata["reward_components"].get(cfg.reward.correct_reward) or 0.0) >= 1.0
                for g in groups
                for t in g.trajectories
            ]
            n_tokens = sum(t.num_generated for g in groups for t in g.trajectories)
            tokens_total += n_tokens
            waited += timings["time/wait_batch"]
            carried = carried_metrics(groups)
            carried_total += int(carried["rollout/carried_tokens"])
            step_time = time.perf_counter() - t_step
            elapsed = max(time.time() - t_rl, 1e-9)
            metrics.update(lag)
            metrics.update(carried)
            metrics.update(timings)
            metrics.update(stream.stats.as_metrics())
            metrics.update(pool.pop_reward_stats())
            metrics["rollout/carried_tokens_total"] = carried_total
            metrics["rollout/worker_restarts"] = pool.restarts
            metrics["rollout/reissued_items"] = pool.reissued
            metrics["rollout/engine_tokens"] = pool.total_engine_stats().get("tokens_generated", 0)
            metrics["time/weight_publish"] = pool.publish_s.get(step + 1, 0.0)
            if step in pool.sync_latency:  # the previous version's, complete by now
                metrics["time/weight_sync_latency"] = pool.sync_latency[step]
            metrics["accuracy"] = sum(correct) / len(correct)
            metrics["time/step"] = step_time
            metrics["tokens_per_s"] = tokens_total / elapsed
            metrics["samples_per_s"] = stream.stats.consumed * cfg.rollout.group_size / elapsed
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.train.steps:
                if colocated:
                    pool.pause()
                metrics["eval/accuracy"] = run_eval(f"step {step + 1}")
                if colocated:
                    pool.resume()
            last_row = metrics
            if step + 1 < cfg.train.steps:  # the last row waits for the final eval
                metrics_log.log(step + 1, metrics)
            if progress:
                progress("rl", step + 1, cfg.train.steps, metrics)
    finally:
        pool.stop()
        stream.close()
        apply_placement(tuple(all_cpus) if placement.trainer_cpus else None, 1)
    stream.check_accounting()
    summary["rl_time_s"] = time.time() - t_rl
    summary["worker_restarts"] = pool.restarts
    summary["reissued_items"] = pool.reissued
    summary["carried_tokens"] = carried_total
    summary["rl_tokens_consumed"] = tokens_total
    # colocated: the time the engine had the cores (generation), the rest was training
    summary["rl_wait_batch_s"] = waited
    latencies = list(pool.sync_latency.values())
    if latencies:
        summary["weight_sync_latency_s_mean"] = sum(latencies) / len(latencies)
    publishes = list(pool.publish_s.values())
    if publishes:
        summary["weight_publish_s_mean"] = sum(publishes) / len(publishes)

    # ---------------------------------------------------------------- wrap-up
    set_threads(cfg)
    summary["eval_accuracy_after"] = run_eval("after RL")
    summary.update(
        {
            "steps": cfg.train.steps,
            "wall_time_s": time.time() - t_start,
            "engine": pool.total_engine_stats(),
            **{k: v for k, v in stream.stats.as_metrics().items()},
        }
    )
    last_row["eval/accuracy"] = summary["eval_accuracy_after"]
    metrics_log.log(cfg.train.steps, last_row)
    metrics_log.close()
    if cfg.run.save_weights:
        trainer.save(run_dir / "model", tokenizer=tokenizer)
    write_json(run_dir / "summary.json", summary)
    logging.getLogger("streamrl").info("run finished: %s", run_dir)
    return RunResult(run_dir=run_dir, summary=summary, trainer=trainer)

"""Synchronous GRPO, top to bottom, on streamrl's public API.

    python -m streamrl.recipes.grpo [CONFIG.yaml] [key=value ...]

This is the algorithm the asynchronous pipeline (``streamrl train``) runs, written
as one plain loop: generate a batch with the current weights, score it, compute
group-relative advantages, take a clipped policy-gradient step, load the new
weights into the inference engine, repeat. With ``stream.max_staleness=0`` the
pipeline leaves exactly the same weights as this loop
(``tests/integration/test_recipes.py``); the pipeline adds overlap of generation and training
(eta >= 1), several workers and backends, fault tolerance, checkpoints and the
run directory. Read the pieces in this order:

    config ........ streamrl/config/                   every key, typed and documented
    episode ....... streamrl/rollout/episodes/          prompt -> completion -> reward
    rollout_group . streamrl/rollout/worker.py         group_size episodes of one item
    algorithm ..... streamrl/algorithms/policy_gradient.py   advantages, loss
    losses ........ streamrl/algorithms/losses.py            PPO-clip and friends
    trainer ....... streamrl/engines/train/engine.py   train_batch(batch, loss_fn)
"""

from __future__ import annotations

import asyncio
import copy
import random
import sys
from typing import Any

import numpy as np
import torch

from streamrl.algorithms import build_algorithm
from streamrl.algorithms.stages import StageInputs, build_sft_stage, run_stage
from streamrl.analysis.evaluate import evaluate_model
from streamrl.config import Config, RunContext, load_config
from streamrl.core.messages import GroupDone
from streamrl.core.timing import StageTimer
from streamrl.engines.factory import engine_options, make_inference_engine
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection import GroupSampler, draws_named
from streamrl.rollout.worker import rollout_group
from streamrl.run.assembly import episode_spec
from streamrl.sources import build_task_source
from streamrl.stream.sample_stream import Group


def grpo(cfg: Config, log=print) -> tuple[TrainEngine, Any]:
    """Train with ``cfg``; returns the trainer (its model holds the final weights) and
    the tokenizer."""
    # ---- 1. Seeds, data, reward, model --------------------------------------------
    # One seed fixes the model's initialisation; sampling noise is a hash of
    # (run seed, item index, sample index), so it does not depend on batching.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    reward = build_reward(cfg.reward)  # weighted reward components, guarded
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.name_or_path, gguf_file=cfg.model.gguf_file, dtype=cfg.model.dtype, seed=cfg.seed
    )

    # ---- 2. Inference engine, trainer, episode, algorithm ------------------------
    # The engine decodes with its own copy of the weights (batched KV cache); every
    # generated token comes back with its behaviour log-prob and weight version.
    options = engine_options(cfg.rollout, cfg.stream.max_staleness)  # the engine's settings
    engine = make_inference_engine(copy.deepcopy(model).eval(), tokenizer, **options)
    trainer = TrainEngine(
        model,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        micro_batch_sequences=cfg.train.micro_batch_sequences,
        compile_layers=cfg.train.compile,
        keep_freed_memory=cfg.runtime.keep_freed_memory,
        # the engine's numbers (rollout.batch_invariant)
        batch_invariant=options["batch_invariant"],
    )
    # The episode turns an item into one scored trajectory (prompt tokens masked);
    # the algorithm owns advantages, extra forwards and the loss.
    episode = build_episode(episode_spec(cfg), tokenizer, reward)
    algo = build_algorithm(cfg.algorithm, RunContext.of(cfg))

    # ---- 3. Optional supervised warm-start --------------------------------------
    if cfg.sft.steps:
        s = cfg.sft
        trainer.reset_optimizer(
            s.lr,
            schedule=s.lr_schedule,
            warmup_steps=s.warmup_steps,
            total_steps=s.steps,
            min_lr_ratio=s.min_lr_ratio,
        )
        # the task's reference answers (multi-turn teacher traces replayed by the episode)
        inputs = StageInputs(
            tokenizer, trainer, cfg.seed, items=source.train_iter, episode=lambda: episode
        )
        sft = build_sft_stage(s, inputs)
        _, last = run_stage(trainer, sft.batches, s.steps, sft.loss_fn, lambda step, m: None)
        log(f"[sft] {s.steps} steps, final loss {last.get('loss', float('nan')):.3f}")
    engine.update_weights(trainer.state_dict_for_inference(), 0)  # version 0: RL's start

    # ---- 4. GRPO ------------------------------------------------------------------
    t = cfg.train
    algo.setup(trainer, tokenizer)  # a frozen reference when algorithm.kl.coef > 0
    trainer.reset_optimizer(
        t.lr,
        schedule=t.lr_schedule,
        warmup_steps=t.warmup_steps,
        total_steps=t.steps * t.num_minibatches * t.epochs,
        min_lr_ratio=t.min_lr_ratio,
    )
    items = source.train_iter(cfg.seed)
    issued = 0  # the item index: it fixes the item's sampling seeds
    # every item is issued; its group is drawn as rollout.group_sampling says
    sampler = GroupSampler(draws_named(cfg.rollout.group_sampling))
    for step in range(1, t.steps + 1):
        # (a) Generate: roll out items until items_per_step groups carry a signal.
        # A group whose rewards are all equal has zero advantage everywhere; the
        # algorithm drops it (dynamic sampling) and another item takes its place.
        groups: list[Group] = []
        while len(groups) < t.items_per_step:
            wave = [next(items) for _ in range(t.items_per_step - len(groups))]
            for item in wave:
                item.index, issued = issued, issued + 1

            async def roll(wave=wave):  # every episode of the wave decodes in one batch
                return await asyncio.gather(
                    *(
                        rollout_group(
                            engine,
                            episode,
                            algo,
                            it,
                            cfg.rollout.group_size,
                            cfg.seed,
                            sampler,
                            reward=reward,  # its group components score each group
                        )
                        for it in wave
                    )
                )

            for report in asyncio.run(roll()):
                if isinstance(report, GroupDone):
                    groups.append(Group(report.item_index, step - 1, list(report.trajectories)))
        groups.sort(key=lambda g: g.item_index)

        # (b) Prepare: one (N, T) batch of prompt+completion tokens; each sequence's
        # advantage A_i = (r_i - mean_group) / (std_group + eps) on its generated
        # tokens (0 on prompt tokens and padding).
        batch = algo.prepare(groups, trainer, StageTimer())

        # (c) Update: minimise the clipped surrogate
        #   -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),  r_t = pi / pi_old
        # averaged over tokens; micro-batches accumulate the exact gradient.
        metrics = trainer.train_batch(
            batch, algo.loss_fn, num_minibatches=t.num_minibatches, epochs=t.epochs
        )

        # (d) Sync: the engine generates the next batch with the new weights.
        engine.update_weights(trainer.state_dict_for_inference(), step)
        if step % max(1, t.steps // 10) == 0 or step == t.steps:
            log(
                f"[grpo] step {step}/{t.steps}  reward {float(batch.rewards.mean()):.3f}  "
                f"loss {metrics.get('loss', float('nan')):.4f}  issued {issued}"
            )
    engine.close()
    return trainer, tokenizer


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print("usage: python -m streamrl.recipes.grpo [CONFIG.yaml] [key=value ...]")
        print("The whole synchronous GRPO loop in one file; the config is streamrl train's.")
        return 0
    path = args[0] if args and "=" not in args[0] else None
    cfg = load_config(path, args[1:] if path else args)
    trainer, tokenizer = grpo(cfg)
    # ---- 5. Evaluate the trained policy greedily, with the same episode ------------
    reward = build_reward(cfg.reward)
    episode = build_episode(
        episode_spec(cfg), tokenizer, reward, max_new_tokens=cfg.eval.max_new_tokens
    )
    heldout = build_task_source(cfg.data.kind, **cfg.data.options).heldout(cfg.eval.heldout_size)
    result = evaluate_model(trainer.model, tokenizer, episode, heldout, cfg.reward.correct_reward)
    print(f"held-out greedy accuracy after GRPO: {result.accuracy:.3f} ({len(heldout)} items)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many groups come out all equal with independent and with stratified draws?

For each policy state of a run, the script samples ``--repeats`` groups of G (the run's
rollout.group_size) for each of ``--items`` training items, once with independent draws
and once with ``rollout.group_sampling=stratified`` (one seed per group, member j's
uniforms shifted by j/G), through the same engine and the run's own reward. It prints the
mean success rate (equal within noise: each stratified sample is an exact draw), the
share of groups with all rewards equal, and dynamic sampling's drops per consumed group,
q / (1 - q).

It also prints the floor no sampler can go below while each of its samples is an exact
draw: by the union bound, P(some sample wrong) <= G (1 - p), so P(all right) >=
1 - G (1 - p), and likewise P(all wrong) >= 1 - G p. The floor is averaged over the
items, with p estimated from all of an item's samples (both draws pooled). Stratified
draws reach it where an item's samples share the context at which they go wrong.

    PYTHONPATH=. python benchmarks/bench_group_sampling.py --run runs/default \
        --states checkpoints/rl-000100 checkpoints/rl-000150 model
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_selection_bound import load_state
from streamrl.config import load_config
from streamrl.core.types import GenerationRequest
from streamrl.engines.inference.engine import LocalEngine
from streamrl.models.tokenizer import encode_prompt
from streamrl.rollout.episodes import sampling_params
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection import draws_named
from streamrl.sources import build_task_source


def outcomes(engine, tokenizer, cfg, items, repeats: int, stratified: bool) -> np.ndarray:
    """(items, repeats, G) 0/1 outcomes of the run's correctness reward."""
    g, params, reward = (
        cfg.rollout.group_size,
        sampling_params(cfg.rollout, tokenizer),
        build_reward(cfg.reward),
    )
    draws = draws_named("stratified" if stratified else "independent")
    members = [
        (view, GenerationRequest(encode_prompt(tokenizer, item), params, seed))
        for i, item in enumerate(items)
        for r in range(repeats)
        for view, seed in draws(engine, r, i, g)
    ]

    async def generate() -> list:  # every request in flight at once: batched together
        return await asyncio.gather(*(view.agenerate(req) for view, req in members))

    scores = []
    for k, res in enumerate(asyncio.run(generate())):
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        scored = reward(text, items[k // (repeats * g)])
        scores.append(float((scored.components[cfg.reward.correct_reward] or 0.0) > 0.5))
    return np.array(scores).reshape(len(items), repeats, g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--states", nargs="+", default=["model"])
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--seed", type=int, default=123, help="draw of training items")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(str(args.run / "config.yaml"))
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    draws = source.train_iter(args.seed)
    items = [next(draws) for _ in range(args.items)]
    print("| state | draws | success rate | all-equal groups | dropped per consumed |")
    print("|---|---|---|---|---|")
    g = cfg.rollout.group_size
    for state in args.states:
        model, tokenizer = load_state(args.run, state)
        engine = LocalEngine(model, decode_slots=64, max_seq_len=256)
        pooled = []
        for stratified in (False, True):
            o = outcomes(engine, tokenizer, cfg, items, args.repeats, stratified)
            pooled.append(o.reshape(len(items), -1))
            rate = o.mean(-1)
            q = float(((rate == 0) | (rate == 1)).mean())
            kind = "stratified" if stratified else "independent"
            row = f"| {state} | {kind} | {o.mean():.4f} | {q:.4f} | {q / (1 - q):.3f} |"
            print(row, flush=True)
        p = np.concatenate(pooled, axis=1).mean(1)
        floor = float((np.clip(1 - g * (1 - p), 0, 1) + np.clip(1 - g * p, 0, 1)).mean())
        print(f"| {state} | floor, any exact sampler | | {floor:.4f} | {floor / (1 - floor):.3f} |")


if __name__ == "__main__":
    main()

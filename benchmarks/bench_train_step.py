"""Seconds per GRPO update of SmolLM2-135M-Instruct, three trainers side by side: the
default (rows packed without padding, each group's prompt computed once, the vocabulary
head on the loss tokens only), padded rows, and padded rows with the head on every
position too.

The batch has the performance issue's shape: 2 chat prompts x 8 samples ("What is
12 + 34? Reply with only the number." with SmolLM2's default system prompt, ~40 tokens)
and completions of up to ``--completion`` tokens, 8 sequences per micro-batch, one
PPO-clip step (the trainer's whole update: forward, backward, AdamW). The variants start
from the same weights and run interleaved, ``--repeats`` times each, after one warm-up each.

    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 8 --threads 1
    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 48 --variants default foreach-adam
    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 24 --variants default dense-embed
    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 24 --variants compile default
    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 24 --variants batch-invariant default
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from streamrl.algorithms import make_rl_loss_fn
from streamrl.core.types import Batch, GenerationResult
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.episodes.single_turn import trajectory_from_result

VARIANTS = {  # --variants name: (label, TrainEngine arguments)
    "default": ("packed, head on loss tokens (default)", {}),
    "padded": ("padded, head on loss tokens", {"packed": False}),
    "padded-every": ("padded, head on every position", {"packed": False, "head_on_targets": False}),
    "foreach-adam": ("packed, foreach AdamW (before fused)", {"fused": False}),
    "micro16": ("packed, 16 sequences a micro-batch", {"micro_batch_sequences": 16}),
    "dense-embed": ("packed, dense embedding gradient (before sparse)", {}),
    "compile": ("packed, decoder layers compiled (train.compile)", {"compile_layers": True}),
    "batch-invariant": (
        "packed, batch-invariant: the engine's numbers (rollout.batch_invariant)",
        {"batch_invariant": True},
    ),
}


def dense_embedding(engine: TrainEngine) -> None:
    """The trainer before the tied embedding sent a sparse gradient."""
    engine.model.get_input_embeddings().sparse = False
    engine._sparse_embedding = None


def make_batch(tokenizer, n: int, completion: int, group: int = 8, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    trajectories = []
    for i in range(n):
        if i % group == 0:  # a new prompt for each group
            a, b = (int(x) for x in torch.randint(10, 100, (2,), generator=g))
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
                add_generation_prompt=True,
                tokenize=True,
            )
            prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
        length = int(torch.randint(max(1, completion // 2), completion + 1, (1,), generator=g))
        tokens = torch.randint(0, len(tokenizer), (length,), generator=g).tolist()
        result = GenerationResult(prompt, tokens, [-2.0] * length, [0] * length, "stop")
        trajectories.append(trajectory_from_result(result, 0.0, i // group, {}))
    batch = Batch.collate(trajectories)
    batch.advantages = torch.where(batch.loss_mask, torch.randn(n, 1, generator=g), 0.0)
    return batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completion", type=int, default=8, help="max completion tokens")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=["default", "padded", "padded-every"],
        help="trainers to time; the ratios are against the last one",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    batch = make_batch(tokenizer, args.sequences, args.completion)
    loss_fn = make_rl_loss_fn("ppo_clip")
    engines = {
        VARIANTS[v][0]: TrainEngine(
            copy.deepcopy(model), lr=5e-6, **{"micro_batch_sequences": 8, **VARIANTS[v][1]}
        )
        for v in args.variants
    }
    if "dense-embed" in args.variants:
        dense_embedding(engines[VARIANTS["dense-embed"][0]])
    times: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(args.repeats + 1):  # the first round is the warm-up
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine.train_batch(batch, loss_fn)
            if not rep:  # the warm-up: a compiled trainer compiles here
                print(f"[warm-up] {name}: {time.perf_counter() - t0:.2f} s", flush=True)
            if rep:
                times[name].append(time.perf_counter() - t0)
                print(f"[{rep}] {name}: {times[name][-1]:.2f} s", flush=True)
    base_name = VARIANTS[args.variants[-1]][0]
    base = statistics.median(times[base_name])
    print(
        f"\nSmolLM2-135M, {args.sequences} sequences of {batch.input_ids.shape[1]} positions "
        f"max, {int(batch.loss_mask.sum())} loss tokens, threads={args.threads}\n"
        f"| trainer | s per update (median) | vs {base_name} |\n|---|---|---|"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()

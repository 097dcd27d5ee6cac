"""Seconds per GRPO update of SmolLM2-135M-Instruct: the vocabulary head on the loss
tokens only (the default) against the head on every position, side by side.

The batch has the performance issue's shape: 2 chat prompts x 8 samples ("What is
12 + 34? Reply with only the number." with SmolLM2's default system prompt, ~40 tokens)
and completions of ``--completion`` tokens, 8 sequences per micro-batch, one PPO-clip
step (the trainer's whole update: forward, backward, AdamW). Both variants start from
the same weights and run interleaved, ``--repeats`` times each, after one warm-up each.

    PYTHONPATH=. python benchmarks/bench_train_step.py --completion 8 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from streamrl.algorithms import make_rl_loss_fn
from streamrl.engines.train import TrainEngine
from streamrl.models import load_model_and_tokenizer
from streamrl.types import Batch


def make_batch(tokenizer, n: int, completion: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        a, b = (int(x) for x in torch.randint(10, 100, (2,), generator=g))
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
            add_generation_prompt=True,
            tokenize=True,
        )
        prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
        length = int(torch.randint(max(1, completion // 2), completion + 1, (1,), generator=g))
        rows.append((prompt, torch.randint(0, len(tokenizer), (length,), generator=g).tolist()))
    t = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(n, t, dtype=torch.long)
    att = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        att[i, : len(p) + len(c)] = True
        loss[i, len(p) : len(p) + len(c)] = True
    return Batch(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss,
        behavior_logprobs=torch.where(loss, -2.0, 0.0),
        versions=torch.where(loss, 0, -1),
        rewards=torch.zeros(n),
        item_index=torch.arange(n) // 8,
        advantages=torch.where(loss, torch.randn(n, 1, generator=g), 0.0),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completion", type=int, default=8, help="max completion tokens")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    batch = make_batch(tokenizer, args.sequences, args.completion)
    loss_fn = make_rl_loss_fn("ppo_clip")
    engines = {
        name: TrainEngine(copy.deepcopy(model), lr=5e-6, micro_batch_sequences=8, head_on_targets=h)
        for name, h in (("head on loss tokens", True), ("head on every position", False))
    }
    times: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(args.repeats + 1):  # the first round is the warm-up
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine.train_batch(batch, loss_fn)
            if rep:
                times[name].append(time.perf_counter() - t0)
                print(f"[{rep}] {name}: {times[name][-1]:.2f} s", flush=True)
    base = statistics.median(times["head on every position"])
    print(
        f"\nSmolLM2-135M, {args.sequences} sequences of {batch.input_ids.shape[1]} positions "
        f"max, {int(batch.loss_mask.sum())} loss tokens, threads={args.threads}\n"
        "| head | s per update (median) | vs every position |\n|---|---|---|"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()

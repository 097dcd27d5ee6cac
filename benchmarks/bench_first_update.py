"""The first SmolLM2 GRPO update with AdamW's state made beforehand
(``prepare_first_step``, which RL calls while the workers generate the first batch)
against the lazy state AdamW makes in its first step.

A fresh process's first update pays page faults for memory nothing touched yet: the
gradients, AdamW's two moments and the activations. Each side runs in its own fresh
process, and the two alternate for ``--rounds`` rounds. Each process builds the trainer
and the batch of `bench_train_step.py` (2 chat prompts x 8 samples, completions of up
to ``--completion`` tokens), starts a stage (``reset_optimizer``, as RL does), then
times the preparation (prepared side only) and the first two updates, with the page
faults and the kernel CPU time of each.

    PYTHONPATH=. python benchmarks/bench_first_update.py --completion 24 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SIDES = {"prepared": "state made before (prepare_first_step)", "lazy": "made in the first step"}


def measured(fn: Callable[[], object]) -> dict[str, float]:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    return {
        "wall": t1 - t0,
        "sys": r1.ru_stime - r0.ru_stime,
        "faults": r1.ru_minflt - r0.ru_minflt,
    }


def one_process(side: str, completion: int, threads: int) -> dict[str, dict[str, float]]:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_train_step import make_batch

    from streamrl.algorithms import make_rl_loss_fn
    from streamrl.engines.train import TrainEngine
    from streamrl.models import load_model_and_tokenizer

    torch.set_num_threads(threads)
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    engine = TrainEngine(model, lr=5e-6, micro_batch_sequences=8)
    engine.reset_optimizer(5e-6)
    batch = make_batch(tokenizer, 16, completion)
    loss_fn = make_rl_loss_fn("ppo_clip")
    out = {"prepare": measured(engine.prepare_first_step if side == "prepared" else lambda: None)}
    out["first"] = measured(lambda: engine.train_batch(batch, loss_fn))
    out["second"] = measured(lambda: engine.train_batch(batch, loss_fn))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completion", type=int, default=24, help="max completion tokens")
    ap.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # a child
    args = ap.parse_args()
    if args.side:
        print(json.dumps(one_process(args.side, args.completion, args.threads)))
        return
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side in SIDES:
            out = subprocess.run(
                [sys.executable, __file__, "--side", side, "--completion", str(args.completion),
                 "--threads", str(args.threads)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[side].append(row)
            print(
                f"[round {r + 1}] {side}: prepare {row['prepare']['wall']:.2f} s, "
                f"first update {row['first']['wall']:.2f} s ({row['first']['faults']:,} faults), "
                f"second {row['second']['wall']:.2f} s"
            )
    print(
        f"\nSmolLM2-135M, 16 sequences, completions of up to {args.completion} tokens, "
        f"threads={args.threads}; medians over {args.rounds} fresh processes per side\n"
        "| AdamW state | prepare s | first update s | its kernel s | its page faults "
        "| second update s | its kernel s | its page faults |\n|---|---|---|---|---|---|---|---|"
    )
    med = {}
    for side, rows in results.items():
        m = {
            (part, k): statistics.median(row[part][k] for row in rows)
            for part in ("prepare", "first", "second")
            for k in ("wall", "sys", "faults")
        }
        med[side] = m
        print(
            f"| {SIDES[side]} | {m['prepare', 'wall']:.2f} | {m['first', 'wall']:.2f} | "
            f"{m['first', 'sys']:.2f} | {m['first', 'faults']:,.0f} | {m['second', 'wall']:.2f} | "
            f"{m['second', 'sys']:.2f} | {m['second', 'faults']:,.0f} |"
        )
    ratio = med["prepared"]["first", "wall"] / med["lazy"]["first", "wall"]
    print(f"\nfirst update, prepared / lazy: {ratio:.2f}x")


if __name__ == "__main__":
    main()

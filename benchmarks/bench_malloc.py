"""SmolLM2 GRPO updates with freed memory kept in the process (`runtime.keep_freed_memory`,
the default) against glibc's own malloc settings.

The setting is process-wide and cannot be undone, so each side runs in its own fresh
process, and the two alternate for ``--rounds`` rounds. Each process builds the trainer
and the batch of `bench_train_step.py` (2 chat prompts x 8 samples, completions of up to
``--completion`` tokens), then times ``--updates`` updates after one warm-up, with the
page faults and the user and kernel CPU time of each.

    PYTHONPATH=. python benchmarks/bench_malloc.py --completion 24 --rounds 3 --updates 4
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = {"kept": "freed memory kept (default)", "glibc": "glibc's defaults"}


def one_process(side: str, completion: int, updates: int, threads: int) -> list[dict]:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_train_step import make_batch

    from streamrl.algorithms import make_rl_loss_fn
    from streamrl.engines.train.engine import TrainEngine
    from streamrl.models import load_model_and_tokenizer

    torch.set_num_threads(threads)
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    engine = TrainEngine(model, lr=5e-6, micro_batch_sequences=8, keep_freed_memory=side == "kept")
    batch = make_batch(tokenizer, 16, completion)
    loss_fn = make_rl_loss_fn("ppo_clip")
    rows = []
    for _ in range(updates + 1):  # the first is the warm-up
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        engine.train_batch(batch, loss_fn)
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        rows.append(
            {
                "wall": t1 - t0,
                "user": r1.ru_utime - r0.ru_utime,
                "sys": r1.ru_stime - r0.ru_stime,
                "faults": r1.ru_minflt - r0.ru_minflt,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completion", type=int, default=24, help="max completion tokens")
    ap.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    ap.add_argument("--updates", type=int, default=4, help="timed updates per process")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # a child
    args = ap.parse_args()
    if args.side:
        print(json.dumps(one_process(args.side, args.completion, args.updates, args.threads)))
        return
    results: dict[str, list[list[dict]]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side in SIDES:
            out = subprocess.run(
                [sys.executable, __file__, "--side", side, "--completion", str(args.completion),
                 "--updates", str(args.updates), "--threads", str(args.threads)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            rows = json.loads(out.stdout.strip().splitlines()[-1])
            results[side].append(rows)
            walls = " ".join(f"{row['wall']:.2f}" for row in rows[1:])
            print(f"[round {r + 1}] {side}: warm-up {rows[0]['wall']:.2f} s, then {walls} s")
    print(
        f"\nSmolLM2-135M, 16 sequences, completions of up to {args.completion} tokens, "
        f"threads={args.threads}; medians over {args.rounds} processes x {args.updates} "
        "updates after each one's warm-up\n"
        "| malloc | s per update | user CPU s | kernel CPU s | page faults | first update s |\n"
        "|---|---|---|---|---|---|"
    )
    med = {}
    for side, runs in results.items():
        steady = [row for rows in runs for row in rows[1:]]
        med[side] = {k: statistics.median(row[k] for row in steady) for k in steady[0]}
        first = statistics.median(rows[0]["wall"] for rows in runs)
        m = med[side]
        print(
            f"| {SIDES[side]} | {m['wall']:.2f} | {m['user']:.2f} | {m['sys']:.2f} | "
            f"{m['faults']:,.0f} | {first:.2f} |"
        )
    print(f"\nkept / glibc, s per update: {med['kept']['wall'] / med['glibc']['wall']:.2f}x")


if __name__ == "__main__":
    main()

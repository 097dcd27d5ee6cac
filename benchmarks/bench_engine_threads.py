"""The SmolLM2 rollout engine's decode step on one torch thread against two.

While the trainer waits for a batch, its core is idle; this measures what the engine
would gain from it. Each engine variant (fp32 and fp16 engine weights) generates the
same fixed-length batch (``--prompts`` chat prompts, ``--tokens`` new tokens each, one
slot per prompt) on one and then two threads, in interleaved rounds.

    PYTHONPATH=. python benchmarks/bench_engine_threads.py --prompts 16 --tokens 32 --rounds 2
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import load_model, run_engine  # noqa: E402

from streamrl.engines.inference import LocalEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model, _, pool, _ = load_model("smollm2")
    prompts = [pool[i % len(pool)] for i in range(args.prompts)]
    max_len = max(map(len, prompts)) + args.tokens + 8
    engines = {
        w: LocalEngine(
            model if w == "float32" else copy.deepcopy(model),
            decode_slots=args.prompts,
            max_seq_len=max_len,
            weights=w,
        )
        for w in ("float32", "float16")
    }
    torch.set_num_threads(1)
    for engine in engines.values():  # warm-up
        run_engine(engine, prompts, [], 4, 10_000)
    ms: dict[tuple[str, int], list[float]] = {(w, t): [] for w in engines for t in (1, 2)}
    for r in range(args.rounds):
        for w, engine in engines.items():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                steps0, t0 = engine.stats.decode_steps, time.perf_counter()
                run_engine(engine, prompts, [], args.tokens, 0)
                steps = engine.stats.decode_steps - steps0
                ms[w, threads].append(1000 * (time.perf_counter() - t0) / steps)
                print(f"[round {r + 1}] {w}, {threads} thread(s): {ms[w, threads][-1]:.1f} ms/step")
    torch.set_num_threads(1)
    print(
        f"\nSmolLM2, {args.prompts} rows, {args.tokens} tokens; median ms per decode step\n"
        "| engine weights | 1 thread | 2 threads | 2 / 1 |\n|---|---|---|---|"
    )
    for w in engines:
        one, two = statistics.median(ms[w, 1]), statistics.median(ms[w, 2])
        print(f"| {w} | {one:.1f} | {two:.1f} | {two / one:.2f}x |")


if __name__ == "__main__":
    main()

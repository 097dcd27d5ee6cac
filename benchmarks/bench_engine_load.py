"""How long the rollout engine takes to load one weight version (SmolLM2-135M).

A rollout worker loads every version the trainer publishes before it can start the
next batch's items (at eta = 1 they may not start on older weights), so this time
sits on the RL step's critical path whenever generation is. One load is
``LocalEngine._load_weights``: ``load_state_dict`` (an in-place fp32 copy), then,
with ``rollout.engine_weights=float16``, FBGEMM's fp16 packing of every layer (with
``onednn``, oneDNN's reordering), and the fused Q/K/V and gate/up copies rebuilt.

Each engine variant loads the same full state dict (what the trainer publishes)
``--repeats`` times, interleaved, one torch thread; the median is reported. The
packing pool's size is the variant: 1 packs on the loading thread alone (the
behaviour before packing was spread over threads), N on N threads.

    PYTHONPATH=. python benchmarks/bench_engine_load.py --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from benchmarks.bench_engine import load_model
from streamrl.engines.inference.engine import LocalEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, nargs="+", default=[1, min(4, len(os.sched_getaffinity(0)))]
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    base, tok, _pool, _stop = load_model("smollm2")
    state = {k: v.detach().clone() + 1e-3 for k, v in base.state_dict().items()}
    engines = {}
    for weights in ("float32", "float16", "onednn"):
        for n in args.threads if weights != "float32" else [1]:
            engine = LocalEngine(copy.deepcopy(base), tok, decode_slots=16, weights=weights)
            engine._packer = ThreadPoolExecutor(n) if n > 1 else None
            engines[f"{weights}, {n} packing thread{'s' if n > 1 else ''}"] = engine
    times: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(args.repeats + 1):  # the first round warms up
        for name, engine in engines.items():
            t = time.perf_counter()
            engine._load_weights(state, r + 1)
            if r:
                times[name].append(time.perf_counter() - t)
    print(f"SmolLM2-135M, one full weight load, median of {args.repeats}")
    print("| engine | load (s) |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.3f} |")


if __name__ == "__main__":
    main()

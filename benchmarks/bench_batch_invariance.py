"""What batch-invariant numerics cost the built-in engine: tokens per second with
``LocalEngine(batch_invariant=False)`` and ``True`` (``rollout.batch_invariant``), side
by side in this process on the same model, prompts and seeds.

Both engines run the same requests (temperature 1, continuous batching over ``--batch``
slots). The repeats interleave the two, alternating which goes first, so load on a
shared machine hits both alike; the ratio is the median of the per-repeat ratios, of
wall time and of this process's CPU time (at one thread, less sensitive to other
processes on the same cores). The two engines' numerics differ in the last bits, so a
near-tie may flip a token: the script prints how many requests' tokens differ.

Workloads (as ``bench_engine.py``):
  eos    completions stop at a stop token, so lengths vary (the RL case)
  fixed  no stop token: every sequence runs max_new_tokens

Example:
  PYTHONPATH=. python benchmarks/bench_batch_invariance.py --model tiny
  PYTHONPATH=. python benchmarks/bench_batch_invariance.py --model smollm2 \\
      --n-prompts 16 --max-new-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.bench_engine import load_model
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine


def requests(prompts: list[list[int]], stop_ids: list[int], max_new: int, seed0: int):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=stop_ids)
    return [GenerationRequest(p, params, seed=seed0 + i) for i, p in enumerate(prompts)]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--workload", choices=["eos", "fixed", "both"], default="both")
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="decode slots")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    model, _tok, pool, eos_ids = load_model(args.model)
    prompts = [pool[i % len(pool)] for i in range(args.n_prompts)]
    max_len = max(map(len, prompts)) + args.max_new_tokens
    engines = {
        mode: LocalEngine(model, decode_slots=args.batch, max_seq_len=max_len, batch_invariant=mode)
        for mode in (False, True)
    }
    workloads = ["eos", "fixed"] if args.workload == "both" else [args.workload]
    table = []
    for wl in workloads:
        stop_ids = eos_ids if wl == "eos" else []
        for engine in engines.values():  # warm-up
            engine.generate(requests(prompts[: args.batch], stop_ids, 8, 10_000))
        rates: dict[bool, list[float]] = {False: [], True: []}
        ratios, cpu_ratios = [], []
        for r in range(args.repeats):
            out, cpu = {}, {}
            for mode in (False, True) if r % 2 == 0 else (True, False):
                t0, c0 = time.perf_counter(), time.process_time()
                res = engines[mode].generate(
                    requests(prompts, stop_ids, args.max_new_tokens, 1000 * r)
                )
                seconds, cpu[mode] = time.perf_counter() - t0, time.process_time() - c0
                out[mode] = res
                rates[mode].append(sum(len(x.token_ids) for x in res) / seconds)
            ratios.append(rates[True][-1] / rates[False][-1])
            cpu_ratios.append(cpu[False] / cpu[True])
            pairs = zip(out[False], out[True], strict=True)
            differ = sum(a.token_ids != b.token_ids for a, b in pairs)
            print(
                f"[{wl} rep {r}] default {rates[False][-1]:.1f} tok/s | batch-invariant "
                f"{rates[True][-1]:.1f} tok/s | ratio {ratios[-1]:.3f} (CPU time "
                f"{cpu_ratios[-1]:.3f}) | requests whose tokens differ: {differ}/{len(prompts)}",
                flush=True,
            )
        med = statistics.median
        table.append((wl, med(rates[False]), med(rates[True]), med(ratios), med(cpu_ratios)))
    print(
        f"\nmodel={args.model} prompts={args.n_prompts} batch={args.batch} "
        f"max_new_tokens={args.max_new_tokens} threads={args.threads} repeats={args.repeats}"
    )
    print(
        "| workload | default tok/s | batch-invariant tok/s | batch-invariant / default "
        "(wall) | (CPU time) |"
    )
    print("|---|---|---|---|---|")
    for wl, base, inv, ratio, cpu_ratio in table:
        print(f"| {wl} | {base:.1f} | {inv:.1f} | {ratio:.3f} | {cpu_ratio:.3f} |")


if __name__ == "__main__":
    main()

"""Synchronous vs asynchronous RL, and partial rollouts on a long-tail workload.

Every run is a real ``streamrl train`` in its own process, one after the other on
the same machine, from one shared SFT checkpoint (examples/default.yaml's model
and task: a 0.6M-param Llama, 2-digit addition), so only the knob under test
changes.

``--part async``: disaggregated one core to one core (process backend: trainer
pinned to core 0, one rollout worker pinned to core 1). eta = 0 (synchronous:
generate one batch, then train on it) against eta = 1, 2, 4 (generation of the
next batches overlaps training). Same number of RL steps, i.e. the same number
of consumed samples. Reports samples/s, time per step, final held-out greedy
accuracy (500 problems) and the staleness distribution of consumed groups.

``--part longtail``: colocated on both cores (generation pauses while the
trainer trains), ``longtail`` source: 1 in 8 prompts has an 8x longer answer
budget and ``rollout.ignore_eos`` makes every answer use its budget. Without
partial rollouts (eta = 0: each step generates exactly its batch, to the last
token of the longest answer) against partial rollouts (eta = 1, 2: the batch is
taken as soon as it is full, unfinished sequences pause and continue after the
weight update). Rollout throughput = consumed tokens / time the engine had the
cores (the trainer's batch wait).

    python benchmarks/bench_async.py --part async --steps 100
    python benchmarks/bench_async.py --part longtail --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "runs" / "bench"


def streamrl(*args: str) -> None:
    cmd = [sys.executable, "-m", "streamrl.cli.main", *args, "run.progress=false"]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def sft_checkpoint() -> Path:
    """examples/default.yaml's SFT phase once; every run starts from its weights."""
    ckpt = WORK / "sft" / "model"
    if not ckpt.exists():
        streamrl(
            "train",
            "examples/default.yaml",
            "train.steps=0",
            "runtime.threads=2",
            f"run.output_dir={WORK}",
            "run.name=sft",
            "run.tensorboard=false",
        )
    return ckpt


def run(name: str, steps: int, overrides: list[str]) -> dict:
    run_dir = WORK / name
    if not (run_dir / "summary.json").exists():
        t0 = time.time()
        streamrl(
            "train",
            "examples/default.yaml",
            f"model.name_or_path={sft_checkpoint()}",
            "sft.steps=0",
            f"train.steps={steps}",
            "eval.every=0",
            f"run.output_dir={WORK}",
            f"run.name={name}",
            "run.tensorboard=false",
            "run.save_weights=false",
            *overrides,
        )
        print(f"  {name}: {time.time() - t0:.0f}s", flush=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r]
    timed = rows[1:]  # the first step also waits for the worker to start
    wait = sum(r["time/wait_batch"] for r in timed) / len(timed)
    lags: Counter[int] = Counter()
    for r in rows:
        for k, v in r.items():
            if k.startswith("staleness/groups_at_lag_"):
                lags[int(k.rsplit("_", 1)[1])] += int(v)
    g = 8  # examples/default.yaml rollout.group_size
    return {
        "name": name,
        "samples_per_s": summary["stream/consumed"] * g / summary["rl_time_s"],
        "step_s": sum(r["time/step"] for r in rows) / len(rows),
        "wait_s": wait,  # at eta = 0: G, generating the batch (and the weight sync)
        "rest_s": sum(r["time/step"] for r in timed) / len(timed) - wait,  # at eta = 0: T
        "acc_before": summary["eval_accuracy_before"],
        "acc_after": summary["eval_accuracy_after"],
        "lags": dict(sorted(lags.items())),
        "rollout_tok_s": summary["rl_tokens_consumed"] / summary["rl_wait_batch_s"],
        "carried": summary["carried_tokens"],
        "rl_time_s": summary["rl_time_s"],
    }


def lag_text(lags: dict[int, int]) -> str:
    total = sum(lags.values())
    return ", ".join(f"{k}: {100 * v / total:.0f}%" for k, v in lags.items())


def part_async(steps: int, etas: list[int]) -> str:
    base = [
        "runtime.backend=process",
        "runtime.placement=disaggregated",
        "runtime.num_rollout_workers=1",
        "runtime.rollout_threads=1",
        "runtime.threads=1",
    ]
    res = [run(f"async-eta{e}", steps, [*base, f"stream.max_staleness={e}"]) for e in etas]
    sync = res[0]
    # overlap can at best hide the shorter of generating (G) and training (T) a batch
    g, t = sync["wait_s"], sync["rest_s"]
    bound = (g + t) / max(g, t)
    step = lambda r: r["wait_s"] + r["rest_s"]  # noqa: E731  (mean from step 2)
    lines = [
        "| eta | samples/s | x sync | x sync per step | % of bound (samples/s, step) | "
        "s/step | held-out acc (before -> after) | groups by staleness |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, r in zip(etas, res, strict=True):
        x, xs = r["samples_per_s"] / sync["samples_per_s"], step(sync) / step(r)
        lines.append(
            f"| {e} | {r['samples_per_s']:.1f} | {x:.2f}x | {xs:.2f}x "
            f"| {100 * x / bound:.0f}%, {100 * xs / bound:.0f}% "
            f"| {r['step_s']:.2f} | {r['acc_before']:.3f} -> {r['acc_after']:.3f} "
            f"| {lag_text(r['lags'])} |"
        )
    lines.append(
        f"\neta = 0: G (batch wait) {g:.3f} s, T (rest of the step) {t:.3f} s, "
        f"overlap bound (G + T) / max(G, T) = {bound:.2f}x"
    )
    return "\n".join(lines)


def part_longtail(steps: int) -> str:
    base = [
        "runtime.backend=local",
        "runtime.placement=colocated",
        "runtime.threads=2",
        "data.kind=longtail",
        "data.options={digits: 2, operators: '+', heldout_size: 500, long_fraction: 0.125, "
        "short_tokens: 8, long_tokens: 64}",
        "rollout.ignore_eos=true",
        "rollout.max_new_tokens=8",
        "algorithm.dynamic_sampling=false",
        "eval.heldout_size=50",
    ]
    variants = [
        ("longtail-sync", "without (eta=0)", ["stream.max_staleness=0"]),
        ("longtail-partial-eta1", "partial, eta=1", ["stream.max_staleness=1"]),
        ("longtail-partial-eta2", "partial, eta=2", ["stream.max_staleness=2"]),
    ]
    res = [run(name, steps, [*base, *extra]) for name, _, extra in variants]
    lines = [
        "| rollouts | rollout tok/s | x without | samples/s | x without | carried tokens | "
        "groups by staleness |",
        "|---|---|---|---|---|---|---|",
    ]
    for (_, label, _), r in zip(variants, res, strict=True):
        lines.append(
            f"| {label} | {r['rollout_tok_s']:.0f} | {r['rollout_tok_s'] / res[0]['rollout_tok_s']:.2f}x"
            f" | {r['samples_per_s']:.1f} | {r['samples_per_s'] / res[0]['samples_per_s']:.2f}x"
            f" | {r['carried']} | {lag_text(r['lags'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["async", "longtail"], required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2, 4])
    args = ap.parse_args()
    table = part_async(args.steps, args.etas) if args.part == "async" else part_longtail(args.steps)
    print(table)


if __name__ == "__main__":
    main()

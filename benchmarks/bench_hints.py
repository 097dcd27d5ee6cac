"""Hints and interleaved SFT against plain GRPO on a task the model starts at 0%.

``examples/hints.yaml`` (the tiny model on reasoning-gym's spell_backward): its SFT
warm-start once (``train.steps=0``, the weights saved), then from those weights each
variant, one after the other, with the same budget of RL wall-clock time
(``run.max_rl_seconds``). One table row per variant: held-out greedy accuracy before and
after, steps done, groups generated and the share of them dropped for equal rewards, and
the hinted groups. Variants:

- ``grpo``: plain GRPO with dynamic sampling (no hints, no demonstrations);
- ``hints``: ``selection.kind=hints``;
- ``hints+sft``: hints and ``algorithm.interleaved_sft.share=0.25`` (the example).

    python benchmarks/bench_hints.py --seconds 150 --out /tmp/hints_bench
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {
    "grpo": ["selection.kind=none", "algorithm.interleaved_sft.share=0"],
    "hints": ["algorithm.interleaved_sft.share=0"],
    "hints+sft": [],
}


def train(out: Path, name: str, *overrides: str) -> dict:
    args = [
        sys.executable,
        "-m",
        "streamrl.cli.main",
        "train",
        str(ROOT / "examples" / "hints.yaml"),
        f"run.output_dir={out}",
        f"run.name={name}",
        "run.progress=false",
        *overrides,
    ]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads((out / name / "summary.json").read_text())


def run(name: str, extra: list[str], seconds: float, out: Path, seed: int) -> dict:
    base = out / f"base-s{seed}" / "model"
    if not base.is_dir():  # the SFT warm-start, once
        train(out, f"base-s{seed}", f"seed={seed}", "train.steps=0", "run.save_weights=true")
    return train(
        out,
        f"{name}-s{seed}",
        f"seed={seed}",
        f"model.name_or_path={base}",
        "sft.steps=0",
        "train.steps=1000",
        f"run.max_rl_seconds={seconds}",
        "run.save_weights=false",
        *extra,
    )


def row(name: str, s: dict) -> str:
    issued = s.get("stream/issued", 0)
    dropped = s.get("stream/filtered/zero_reward_std", 0)
    share = dropped / issued if issued else float("nan")
    return (
        f"| {name} | {s['eval_accuracy_before']:.2f} -> **{s['eval_accuracy_after']:.2f}** | "
        f"{s['steps']} | {s['rl_time_s']:.0f} | {issued} | {dropped} ({share:.0%}) | "
        f"{int(s.get('hints/hinted', 0))} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=600.0, help="RL wall-clock per variant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("/tmp/hints_bench"))
    p.add_argument("--only", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides for every variant")
    p.add_argument("--tag", default="", help="appended to the run names (runs with --set)")
    a = p.parse_args()
    header = "| variant | held-out accuracy before -> after | steps | RL s | groups generated "
    print(header + "| dropped (all equal) | hinted groups |")
    print("|---|---|---|---|---|---|---|")
    for name in a.only:
        summary = run(name + a.tag, [*VARIANTS[name], *a.set], a.seconds, a.out, a.seed)
        print(row(name + a.tag, summary), flush=True)


if __name__ == "__main__":
    main()

"""On-policy distillation vs SFT alone, at the same wall clock, on the same data.

Arm ``distill``: ``examples/distill.yaml`` (a fresh ``tiny-small`` student; SFT on the
main job's demonstrations for ``--sft-steps``, then on-policy distillation from
``--teacher`` for ``--seconds`` of RL wall time). Arm ``sft``: the same config with
``train.steps=0`` and SFT continued for as many more steps as the distillation's wall
time buys at the SFT step rate measured in the first arm. Both arms run one after the
other in this process with the same seed and threads; the table gives each arm's wall
time and its held-out greedy and sampled accuracy (``--heldout`` problems never trained
on), and the teacher's.

Example:
  PYTHONPATH=. python benchmarks/bench_distill.py --teacher runs/default/model --seconds 120
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from streamrl.config import load_config
from streamrl.run.launch import train

QUIET = ["run.progress=false", "run.tensorboard=false", "runtime.threads=1"]


def run(out: Path, name: str, overrides: list[str]) -> tuple[dict, float]:
    cfg = load_config(
        "examples/distill.yaml", [*QUIET, f"run.output_dir={out}", f"run.name={name}", *overrides]
    )
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    return json.loads((out / name / "summary.json").read_text()), wall


def sft_seconds_per_step(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    return (rows[-1]["wall_time"] - rows[0]["wall_time"]) / max(len(rows) - 1, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", default="runs/default/model")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--heldout", type=int, default=500)
    p.add_argument("--out", default="runs/bench_distill")
    args = p.parse_args()
    out = Path(args.out)
    common = [f"eval.heldout_size={args.heldout}", f"sft.steps={args.sft_steps}"]
    distill, wall_d = run(
        out,
        "distill",
        [
            *common,
            f"algorithm.distill.teacher={args.teacher}",
            f"run.max_rl_seconds={args.seconds}",
        ],
    )
    per_step = sft_seconds_per_step(out / "distill")
    extra = round(distill["rl_time_s"] / per_step)
    sft, wall_s = run(
        out,
        "sft",
        [
            *common,
            f"sft.steps={args.sft_steps + extra}",
            "train.steps=0",
            "algorithm.name=grpo",
        ],
    )
    teacher, _ = run(
        out,
        "teacher",
        [
            f"eval.heldout_size={args.heldout}",
            f"model.name_or_path={args.teacher}",
            "sft.steps=0",
            "train.steps=0",
            "algorithm.name=grpo",
        ],
    )
    print(
        f"teacher {args.teacher}; SFT warm start {args.sft_steps} steps; "
        f"SFT {per_step:.3f} s/step; held-out {args.heldout}\n"
    )
    print("| arm | wall s | RL s | SFT steps | greedy acc | sampled acc |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| teacher | - | - | - | {teacher['eval_accuracy_before']:.3f} | "
        f"{teacher['eval_sampled_accuracy_before']:.3f} |"
    )
    print(
        f"| SFT warm start (both arms) | - | - | {args.sft_steps} | "
        f"{distill['eval_accuracy_before']:.3f} | {distill['eval_sampled_accuracy_before']:.3f} |"
    )
    print(
        f"| + distillation | {wall_d:.0f} | {distill['rl_time_s']:.0f} | {args.sft_steps} | "
        f"{distill['eval_accuracy_after']:.3f} | {distill['eval_sampled_accuracy_after']:.3f} |"
    )
    print(
        f"| + SFT alone | {wall_s:.0f} | 0 | {args.sft_steps + extra} | "
        f"{sft['eval_accuracy_after']:.3f} | {sft['eval_sampled_accuracy_after']:.3f} |"
    )


if __name__ == "__main__":
    main()

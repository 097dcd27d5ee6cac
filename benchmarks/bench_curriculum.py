"""Does a difficulty curriculum (with per-prompt rollout budgets) learn where plain GRPO
cannot? Plain GRPO and the curriculum, the same wall clock, on reasoning-gym tasks.

For each task, seed and arm the script runs ``examples/curriculum.yaml`` (SmolLM2-135M-
Instruct, chat-format reasoning-gym, asynchronous GRPO, 2 cores) for ``--seconds`` of RL
wall time (``run.max_rl_seconds``), evaluating the held-out split (the task as
configured) before and after:

* ``grpo``: ``selection.kind=none``, the training items the task as configured (today);
* ``curriculum``: ``selection.kind=curriculum`` with budgets, starting at level 0 of the
  task's reasoning-gym curriculum;
* ``curriculum+sft``: the curriculum, and SFT interleaved with RL on the reference answers
  of the prompts whose groups came out all wrong (``algorithm.interleaved_sft.source:
  reference``, ReLIFT; ``SFT_OVERRIDES``). (Hints cannot join the curriculum: both are a
  ``selection.kind``.)

The arms of a seed run back to back, their order alternating with the seed, so load
drift on the machine falls on both. Each run is its own process (``streamrl train``).
Reported per task and arm: held-out accuracy before and after (mean over seeds, with a
95% stratified-bootstrap CI when there are >= 2 seeds, ``streamrl.analysis.stats``), the
items consumed, and the share of generated groups dropped for equal rewards (dynamic
sampling: all right or all wrong), ``zero_reward_std / (consumed + zero_reward_std)``.

A run whose every group is dropped never ends a step, so ``run.max_rl_seconds`` cannot
end it: it is stopped (SIGTERM) ``--grace`` seconds after its wall clock. A run that
took no RL step then, or stopped with nothing to learn (``algorithm.max_dropped_in_a_row``)
before any, has its before-accuracy as after (its weights never changed), and its
consumed and dropped groups are read from its ledger; it is counted as unfinished.

    PYTHONPATH=. python benchmarks/bench_curriculum.py \
        --tasks chain_sum basic_arithmetic leg_counting --seeds 0 1 2 \
        --arms grpo curriculum+sft --seconds 60 --grace 300 --heldout 100 \
        --set sft.steps=12 sft.examples_per_step=16 sft.lr=1e-4 sft.warmup_steps=0 \
              sft.corrupt_fraction=0 sft.eval_every=0 algorithm.max_dropped_in_a_row=64

SmolLM2-135M scores 0 on these tasks at every level (it answers in sentences), so no
arm takes an RL step without the SFT warm start (``--set``); ``--grace`` must cover the
model load, the warm start and both evaluations
(``benchmarks/results/curriculum.md``).

``--arms`` picks the arms (all three by default); ``--set`` adds config overrides to every
arm (e.g. an SFT warm start on the task's reference answers: ``sft.steps=20
sft.corrupt_fraction=0``).

The reduced check: ``--tasks leg_counting --seeds 0 --seconds 150 --grace 240 --heldout 32``.
Writes the runs under ``--out`` and the table to stdout (and ``--table``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "curriculum.yaml"
ARMS = ("grpo", "curriculum", "curriculum+sft")
SFT_OVERRIDES = (
    "algorithm.interleaved_sft.share=0.25",
    "algorithm.interleaved_sft.source=reference",
    "algorithm.interleaved_sft.weight=1.0",
)


def arm_config(arm: str, out: Path) -> Path:
    """The example as is (``curriculum``; ``curriculum+sft`` adds ``SFT_OVERRIDES``), or
    without its ``selection`` section (``grpo``: every item the task as configured, each
    group rollout.group_size samples)."""
    if arm != "grpo":
        return CONFIG
    config = yaml.safe_load(CONFIG.read_text())
    del config["selection"]
    config["run"]["name"] = "grpo"
    path = out / "grpo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_one(task: str, seed: int, arm: str, args: argparse.Namespace) -> dict:
    """One run's summary (``status`` 'failed' and the error's last line if it stopped)."""
    name = f"{task}-{arm.replace('+', '-')}-s{seed}"
    overrides = [
        f"seed={seed}",
        f"data.options.task={task}",
        f"data.options.heldout_size={args.heldout}",
        f"eval.heldout_size={args.heldout}",
        f"run.max_rl_seconds={args.seconds}",
        "train.steps=100000",
        f"run.output_dir={args.out}",
        f"run.name={name}",
        "run.progress=false",
        "run.tensorboard=false",
        "run.save_weights=false",
        *(SFT_OVERRIDES if arm == "curriculum+sft" else ()),
        *args.set,
    ]
    run_dir = Path(args.out) / name
    if run_dir.exists():  # (streamrl would write to <name>-1: the summary read is this one)
        raise SystemExit(f"{run_dir} exists: give an empty --out")
    config = arm_config(arm, Path(args.out))
    cmd = [sys.executable, "-m", "streamrl.cli.main", "train", str(config), *overrides]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:  # the run ends itself after the step that passes the wall clock ...
        _, err = proc.communicate(timeout=args.seconds + args.grace)
        stopped = False
    except subprocess.TimeoutExpired:  # ... unless no step ends: every group dropped
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        stopped = True
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["wall_s"] = time.time() - t0
    stderr = err.decode(errors="replace")
    if stopped or proc.returncode != 0:
        summary.update(unfinished(run_dir, stderr, stopped))
    # 18 runs' SmolLM2 checkpoints (weights and AdamW state) once filled the disk
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return summary


def unfinished(run_dir: Path, stderr: str, stopped: bool) -> dict:
    """What a run that did not finish shows (stopped at the wall clock with no step
    since, or failed: nothing to learn): its before-accuracy (run.log) and, when it took
    no RL step at all, its after-accuracy, the same (its weights never changed); the items
    consumed and the groups dropped, from its ledger (written at its last checkpoint; a
    stopped run checkpoints as it stops)."""
    out: dict = {"status": "wall clock, no step" if stopped else "failed"}
    if not stopped:
        out["error"] = (stderr.strip().splitlines() or ["?"])[-1][:200]
    if found := re.findall(r"eval before RL: accuracy ([0-9.]+)", _text(run_dir / "run.log")):
        out["eval_accuracy_before"] = float(found[-1])
    ledger = [json.loads(r) for r in _text(run_dir / "ledger.jsonl").splitlines()]
    consumed = sum(len(r["consumed"]) for r in ledger)
    dropped = sum(len(r.get("filtered", {}).get("zero_reward_std", [])) for r in ledger)
    out["stream/consumed"], out["stream/filtered/zero_reward_std"] = consumed, dropped
    if consumed == 0 and "eval_accuracy_before" in out:
        out["eval_accuracy_after"] = out["eval_accuracy_before"]
    return out


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def dropped_share(s: dict) -> float:
    """Generated groups dropped for equal rewards, of the groups generated and judged."""
    dropped = s.get("stream/filtered/zero_reward_std", 0)
    total = dropped + s.get("stream/consumed", 0)
    return dropped / total if total else float("nan")


def after(s: dict) -> float:
    """Held-out accuracy after RL (a run that took no step: its before; NaN: unknown)."""
    return float(s.get("eval_accuracy_after", float("nan")))


def interval(values: list[float]) -> str:
    """mean [95% CI] over seeds (rliable's stratified bootstrap); the mean alone for one."""
    if len(values) < 2 or any(np.isnan(values)):
        return f"{np.mean(values):.3f}"
    from streamrl.analysis.stats import interval_estimates

    point, lo, hi = interval_estimates({"x": np.array(values)[:, None]})["x"]["mean"]
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def table(results: dict[tuple[str, str], list[dict]]) -> str:
    lines = [
        "| task | arm | seeds | held-out before | held-out after | after - before | "
        "items consumed | groups dropped (all equal) | unfinished runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (task, arm), runs in results.items():
        before = [float(s.get("eval_accuracy_before", float("nan"))) for s in runs]
        gained = [after(s) - b for s, b in zip(runs, before, strict=True)]
        steps = [s.get("stream/consumed", 0) for s in runs]
        stopped = sum(s.get("status") in ("failed", "wall clock, no step") for s in runs)
        # (a run stopped after some steps has no after-accuracy: its CI is left out)
        lines.append(
            f"| {task} | {arm} | {len(runs)} | {interval(before)} | "
            f"{interval([after(s) for s in runs])} | {interval(gained)} | "
            f"{np.mean(steps):.0f} | {interval([dropped_share(s) for s in runs])} | "
            f"{stopped} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["leg_counting", "basic_arithmetic", "chain_sum"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--seconds", type=float, default=900.0, help="RL wall time per run")
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument(
        "--grace",
        type=float,
        default=600.0,
        help="seconds a run may take beyond --seconds (model load, evaluations) before it "
        "is stopped: a run whose every group is dropped never ends a step",
    )
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for every arm")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_curriculum"))
    ap.add_argument("--table", type=Path, default=None)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    arms = args.arms
    results: dict[tuple[str, str], list[dict]] = {(t, a): [] for t in args.tasks for a in arms}
    for task in args.tasks:
        for seed in args.seeds:
            order = list(arms) if seed % 2 == 0 else list(reversed(arms))
            for arm in order:
                s = run_one(task, seed, arm, args)
                results[(task, arm)].append(s)
                print(
                    f"{task} {arm} seed {seed}: before {s.get('eval_accuracy_before')} after "
                    f"{after(s)} dropped {dropped_share(s):.3f} consumed "
                    f"{s.get('stream/consumed')} {s.get('status')} {s.get('error', '')} "
                    f"({s['wall_s']:.0f} s)",
                    flush=True,
                )
    text = table(results)
    print(text)
    if args.table is not None:
        args.table.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Held-out pass@1 before and after RL, with 95% bootstrap confidence intervals.

Reads the per-item outcomes that ``streamrl eval ... --out FILE`` writes (the same
held-out items, in the same order, in each file), and prints a Markdown table: each
file's pass@1 (the mean over items of each item's share of correct samples, the
unbiased pass@1) with a percentile bootstrap interval over items (rliable, through
``streamrl.analysis.stats``), and the paired difference of the last file against the
first with its own bootstrap interval (items resampled together).

    python benchmarks/code_tests_passk.py before.json after.json [--labels A B]
    python benchmarks/code_tests_passk.py before.json after.json --plot docs/code_tests.png \
        --metrics RUN_DIR/metrics.jsonl   # a second panel: the training reward per step
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from streamrl.analysis.passk import pass_at_k_per_item
from streamrl.analysis.stats import interval_estimates

REPS, SEED = 2000, 0


def per_item(path: Path) -> tuple[list[str], np.ndarray]:
    data = json.loads(path.read_text())
    items = data["items"]
    return [it["id"] for it in items], pass_at_k_per_item([it["correct"] for it in items], 1)


def paired_difference(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float]:
    """Mean of after - before with a 95% percentile bootstrap over items."""
    diff = after - before
    rng = np.random.default_rng(SEED)
    means = diff[rng.integers(0, len(diff), size=(REPS, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--labels", nargs="+")
    parser.add_argument("--plot", type=Path, help="write a bar chart with the intervals")
    parser.add_argument("--metrics", type=Path, help="a run's metrics.jsonl, for --plot")
    args = parser.parse_args()
    labels = args.labels or [f.stem for f in args.files]
    loaded = [per_item(f) for f in args.files]
    ids = loaded[0][0]
    for f, (other, _) in zip(args.files, loaded, strict=True):
        if other != ids:
            raise SystemExit(f"{f}: not the same held-out items as {args.files[0]}")
    scores = {label: s for label, (_, s) in zip(labels, loaded, strict=True)}
    intervals = interval_estimates(scores, reps=REPS, seed=SEED)
    print(f"held-out items: {len(ids)}\n")
    print("| | pass@1 | 95% CI |\n|---|---|---|")
    for label in labels:
        point, low, high = intervals[label]["mean"]
        print(f"| {label} | {point:.3f} | [{low:.3f}, {high:.3f}] |")
    if len(labels) > 1:
        point, low, high = paired_difference(scores[labels[0]], scores[labels[-1]])
        print(f"| {labels[-1]} − {labels[0]} (paired) | {point:+.3f} | [{low:+.3f}, {high:+.3f}] |")
    if args.plot:
        plot(labels, intervals, args.plot, args.metrics)


def plot(labels: list[str], intervals: dict, out: Path, metrics: Path | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [intervals[label]["mean"] for label in labels]
    fig, axes = plt.subplots(1, 2 if metrics else 1, figsize=(8.5 if metrics else 4.5, 3.2))
    ax = axes[0] if metrics else axes
    if metrics:
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        rows = [r for r in rows if "reward/unit_tests" in r]
        axes[1].plot([r["step"] for r in rows], [r["reward/unit_tests"] for r in rows], "o-")
        axes[1].set_xlabel("RL step")
        axes[1].set_ylabel("training reward (share of tests passed)")
        axes[1].set_ylim(0, 1)
    ax.bar(
        labels,
        [p for p, _, _ in points],
        yerr=[[p - lo for p, lo, _ in points], [hi - p for p, _, hi in points]],
        capsize=6,
        color=["#999999", "#3b75af", "#e1812c"][: len(labels)],
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out pass@1 (95% CI)")
    ax.set_title("unit_tests reward: SmolLM2-135M on code tasks", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()

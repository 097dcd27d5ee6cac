"""``streamrl plot RUN_DIR``: one PNG of a run's curves from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from streamrl.eval.plots import _save

PANELS = (
    ("reward", ("rollout/reward_mean", "reward_mean"), "reward: all rollouts / consumed batch"),
    ("eval", ("eval/accuracy",), "held-out greedy accuracy"),
    ("staleness", ("staleness/mean", "staleness/max"), "staleness (versions)"),
)


def load_metrics(run_dir: Path) -> list[dict]:
    rows: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["step"])] = row  # the last occurrence of a step wins
    return [rows[s] for s in sorted(rows)]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    run_dir = Path(run_dir)
    rows = load_metrics(run_dir)
    fig = Figure(figsize=(12, 3.4))
    axes = fig.subplots(1, len(PANELS))
    for ax, (_, keys, title) in zip(axes, PANELS, strict=True):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 20 else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    summary = run_dir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        fig.suptitle(
            f"{run_dir.name}: held-out accuracy {s['eval_accuracy_before']:.3f} -> "
            f"{s['eval_accuracy_after']:.3f} (wall time {s['wall_time_s']:.0f}s)"
        )
    fig.tight_layout()
    return _save(fig, out or run_dir / "curves.png")

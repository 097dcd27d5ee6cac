"""``streamrl plot RUN_DIR``: one PNG of a run's curves from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from streamrl.analysis.plots import save_figure
from streamrl.analysis.runs import METRICS, load_metrics, read_summary, status_problem

PANELS = (
    ("reward", ("rollout/reward_mean", "reward_mean"), "reward: all rollouts / consumed batch"),
    ("eval", ("eval/accuracy", "eval/sampled_accuracy"), "held-out accuracy: greedy / sampled"),
    ("staleness", ("staleness/mean", "staleness/max"), "staleness (versions)"),
)
TITLE_KEYS = ("eval_accuracy_before", "eval_accuracy_after", "wall_time_s")


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's reward, eval accuracy and staleness curves; return the PNG's path.

    Raises FileNotFoundError or ValueError, naming the run and why, when there is nothing
    to plot (no such directory, no metrics.jsonl, or no rows in it).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory")
    summary = read_summary(run_dir)
    problem = status_problem(summary)
    status = f"; run status: {problem}" if problem else ""
    if not (run_dir / METRICS).is_file():
        raise FileNotFoundError(f"{run_dir}: nothing to plot: no {METRICS}{status}")
    rows = load_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: nothing to plot: {METRICS} has no rows{status}")
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
        if ax.lines:  # a panel whose keys were never logged stays empty
            ax.legend(fontsize=8)
    if problem:
        fig.suptitle(f"{run_dir.name}: {problem}")
    elif summary is not None and all(k in summary for k in TITLE_KEYS):
        s = summary
        fig.suptitle(
            f"{run_dir.name}: held-out accuracy {s['eval_accuracy_before']:.3f} -> "
            f"{s['eval_accuracy_after']:.3f} (wall time {s['wall_time_s']:.0f}s)"
        )
    fig.tight_layout()
    return save_figure(fig, out or run_dir / "curves.png")

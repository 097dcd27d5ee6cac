"""Matplotlib figures for `streamrl compare`: learning curves and interval estimates.

Figures are drawn with the object-oriented API on an Agg canvas, so importing this module
never changes the global pyplot backend and works without a display.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from streamrl.core.atomic import replacing

__all__ = ["Curve", "plot_intervals", "plot_learning_curves", "save_figure"]

Interval = tuple[float, float, float]  # (point, lo, hi)


@dataclass
class Curve:
    """One group's learning curve: pointwise center and band over runs, shape (n_points,)."""

    steps: np.ndarray
    center: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n_runs: int


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Render ``fig`` on an Agg canvas to ``path`` (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    with replacing(path) as tmp:  # an old figure stays whole until the new one is
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


def plot_learning_curves(
    curves: Mapping[str, Curve], metric: str, path: str | Path, confidence: float = 0.95
) -> Path:
    """Mean learning curve of each group with its bootstrap band; x is the training step."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, curve in curves.items():
        (line,) = ax.plot(curve.steps, curve.center, label=f"{label} (n={curve.n_runs})")
        ax.fill_between(curve.steps, curve.lo, curve.hi, color=line.get_color(), alpha=0.2)
        if len(curve.steps) == 1:  # a single point has no visible line or band
            ax.errorbar(
                curve.steps,
                curve.center,
                yerr=[curve.center - curve.lo, curve.hi - curve.center],
                fmt="o",
                color=line.get_color(),
            )
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean over seeds, {confidence:.0%} bootstrap band")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def plot_intervals(
    intervals: Mapping[str, Mapping[str, Interval]],
    metric: str,
    path: str | Path,
    confidence: float = 0.95,
) -> Path:
    """One panel per aggregate (IQM, mean): a horizontal CI bar and point per group."""
    labels = list(intervals)
    aggregates = [("iqm", "IQM"), ("mean", "Mean")]
    fig = Figure(figsize=(4.0 * len(aggregates), 0.6 * len(labels) + 1.6), layout="constrained")
    axes = fig.subplots(1, len(aggregates), sharey=True, squeeze=False)[0]
    colors = [f"C{i % 10}" for i in range(len(labels))]
    y = np.arange(len(labels))[::-1]  # first group on top
    for ax, (key, title) in zip(axes, aggregates, strict=True):
        for yi, label, color in zip(y, labels, colors, strict=True):
            point, lo, hi = intervals[label][key]
            ax.barh(yi, hi - lo, left=lo, height=0.6, color=color, alpha=0.6)
            ax.vlines(point, yi - 0.3, yi + 0.3, color="black", linewidth=2)
        ax.margins(x=0.1)
        ax.set_title(title)
        ax.set_xlabel(metric)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels)
    fig.suptitle(f"{confidence:.0%} stratified-bootstrap CIs")
    return save_figure(fig, path)

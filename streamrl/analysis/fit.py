"""`streamrl compare --fit sigmoid`: the saturating compute-to-performance curve (ScaleRL).

Per recipe, every logged evaluation of every run is a point (C, R): C is the RL compute
spent when it was taken, R the metric. The points are fitted with

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

where R0 is the performance before RL (the mean of the points at C = 0, or a fourth
parameter when no run logged one), A the asymptote, C_mid the compute at which half of
the gain A - R0 is reached, and B the slope (larger B: a sharper rise around C_mid).
Intervals come from a bootstrap over runs (resampling whole runs, so that the points of
one run stay together), or over points when a recipe has a single run.

Compute is one of ``step`` (optimizer steps), ``wall_time`` (seconds since the first
logged step of the run), a cumulative metrics.jsonl key such as ``rollout/engine_tokens``,
or ``sum:KEY`` for a per-step key (``sum:rollout/samples``). Each run's compute is counted
from its first logged row, so time spent before RL (SFT, start-up) is not counted.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.analysis.plots import save_figure
from streamrl.analysis.runs import Run, RunError
from streamrl.core.atomic import write_text

__all__ = ["SigmoidFit", "fit_sigmoid", "fit_groups", "plot_fits", "run_points", "sigmoid"]

PARAMS = ("A", "C_mid", "B", "R0")
MIN_POINTS = 4  # three free parameters need more points than that to mean anything


def sigmoid(c: np.ndarray, a: float, c_mid: float, b: float, r0: float) -> np.ndarray:
    """R(C) of the module docstring; R(0) = R0, R(C_mid) = (A + R0) / 2, R(inf) = A."""
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.where(c > 0, (c_mid / np.maximum(c, 1e-300)) ** b, np.inf)
    return r0 + (a - r0) / (1.0 + ratio)


@dataclass
class SigmoidFit:
    """One recipe's fit: parameters, 95% intervals, and the points it was fitted on."""

    params: dict[str, float]  # A, C_mid, B, R0
    intervals: dict[str, tuple[float, float]]  # parameter -> (lo, hi); empty if not bootstrapped
    compute: np.ndarray  # (n_points,)
    values: np.ndarray  # (n_points,)
    n_runs: int
    r0_fitted: bool  # R0 was a free parameter (no point at C = 0)
    rmse: float
    notes: list[str] = field(default_factory=list)

    def predict(self, c: np.ndarray) -> np.ndarray:
        p = self.params
        return sigmoid(c, p["A"], p["C_mid"], p["B"], p["R0"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "n_points": int(self.compute.size),
            "n_runs": self.n_runs,
            "r0_fitted": self.r0_fitted,
            "rmse": self.rmse,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- points


def _compute_series(run: Run, compute: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, compute spent by each step) for one run, counted from its first row."""
    if compute == "step":
        steps = np.array([r["step"] for r in run.metrics], dtype=np.float64)
        return steps, steps - (steps[0] if steps.size else 0.0)
    key, cumulate = (compute[4:], True) if compute.startswith("sum:") else (compute, False)
    if key == "wall_time":
        steps, values = run.series("wall_time")
    else:
        steps, values = run.series(key)
    if steps.size == 0:
        raise RunError(f"{run.path}: compute key {key!r} is never logged in metrics.jsonl")
    if cumulate:
        values = np.cumsum(values)
        values = values - values[0]
    elif np.any(np.diff(values) < 0):
        raise RunError(
            f"{run.path}: compute key {key!r} decreases between steps, so it is not a "
            f"cumulative count; use --compute sum:{key} to add it up over steps"
        )
    else:
        values = values - values[0]
    return steps, values


def run_points(run: Run, key: str, compute: str) -> tuple[np.ndarray, np.ndarray]:
    """(compute, value) of every logged ``key`` in one run, each shape (n,)."""
    steps, values = run.series(key)
    c_steps, c_values = _compute_series(run, compute)
    # Steps before the first compute record cost nothing yet (an eval at step 0).
    spent = np.interp(steps, c_steps, c_values, left=0.0)
    return spent, values


# --------------------------------------------------------------------------- fitting


def fit_sigmoid(
    compute: np.ndarray, values: np.ndarray, *, upper: float | None = None
) -> tuple[dict[str, float], bool, float]:
    """Least-squares fit; returns (params, r0_fitted, rmse). Raises ValueError if it fails.

    ``upper`` bounds the asymptote from above (1.0 for accuracies: none can exceed it).
    """
    from scipy.optimize import curve_fit

    c, y = np.asarray(compute, np.float64), np.asarray(values, np.float64)
    at_zero = c <= 0
    positive = c[~at_zero]
    if positive.size < 3 or np.unique(positive).size < 3:
        raise ValueError("need evaluations at 3 or more distinct compute values above 0")
    hi_a = np.inf if upper is None else upper
    lo_c, hi_c = math.log(positive.min()) - 5.0, math.log(positive.max()) + 5.0
    a0 = float(np.clip(y.max(), y.min(), hi_a if np.isfinite(hi_a) else y.max()))
    lc0 = float(np.log(np.median(positive)))
    r0_fitted = not at_zero.any()
    if r0_fitted:

        def model(x, a, log_c_mid, b, r0):  # noqa: ANN001, ANN202 (scipy's calling convention)
            return sigmoid(x, a, math.exp(log_c_mid), b, r0)

        p0 = [a0, lc0, 1.0, float(y[np.argmin(c)])]
        lo = [-np.inf, lo_c, 0.05, -np.inf]
        hi = [hi_a, hi_c, 20.0, hi_a]
    else:
        r0 = float(y[at_zero].mean())

        def model(x, a, log_c_mid, b):  # noqa: ANN001, ANN202
            return sigmoid(x, a, math.exp(log_c_mid), b, r0)

        p0, lo, hi = [a0, lc0, 1.0], [-np.inf, lo_c, 0.05], [hi_a, hi_c, 20.0]
    p0 = [
        float(np.clip(v, lo_i + 1e-9, hi_i - 1e-9))
        for v, lo_i, hi_i in zip(p0, lo, hi, strict=True)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OptimizeWarning on a flat covariance: fine here
        try:
            popt, _ = curve_fit(model, c, y, p0=p0, bounds=(lo, hi), maxfev=20000)
        except RuntimeError as e:  # no convergence
            raise ValueError(f"the fit did not converge: {e}") from e
    a, log_c_mid, b = (float(v) for v in popt[:3])
    r0 = float(popt[3]) if r0_fitted else r0
    params = {"A": a, "C_mid": math.exp(log_c_mid), "B": b, "R0": r0}
    rmse = float(np.sqrt(np.mean((sigmoid(c, a, params["C_mid"], b, r0) - y) ** 2)))
    return params, r0_fitted, rmse


def _bootstrap(
    points: Sequence[tuple[np.ndarray, np.ndarray]],
    fitted: Mapping[str, float],
    upper: float | None,
    reps: int,
    seed: int,
) -> tuple[dict[str, tuple[float, float]], int]:
    """95% percentile intervals of each parameter, and how many refits failed.

    With several runs, whole runs are resampled. With one run, its few evaluations cannot
    be resampled without losing the design (a draw may miss the early points), so the
    residuals of the fit are resampled onto the fitted curve at the same compute values.
    """
    rng = np.random.default_rng(seed)
    p = fitted
    if len(points) == 1:
        c = points[0][0]
        center = sigmoid(c, p["A"], p["C_mid"], p["B"], p["R0"])
        residuals = points[0][1] - center
    draws: dict[str, list[float]] = {k: [] for k in PARAMS}
    failed = 0
    for _ in range(reps):
        if len(points) == 1:
            y = center + rng.choice(residuals, size=residuals.size, replace=True)
        else:
            pick = rng.integers(0, len(points), size=len(points))
            c = np.concatenate([points[i][0] for i in pick])
            y = np.concatenate([points[i][1] for i in pick])
        try:
            params, _, _ = fit_sigmoid(c, y, upper=upper)
        except ValueError:
            failed += 1
            continue
        for k in PARAMS:
            draws[k].append(params[k])
    if not draws["A"]:
        return {}, failed
    pct = {
        k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for k, v in draws.items()
    }
    return pct, failed


def fit_groups(
    groups: Mapping[str, Sequence[Run]],
    key: str,
    compute: str = "step",
    *,
    reps: int = 200,
    seed: int = 0,
) -> tuple[dict[str, SigmoidFit], list[str]]:
    """Fit every group; returns (fits by group, notes on the groups that could not be fitted)."""
    fits: dict[str, SigmoidFit] = {}
    notes: list[str] = []
    for label, runs in groups.items():
        points = [run_points(r, key, compute) for r in runs]
        points = [(c, y) for c, y in points if c.size]
        if not points:
            notes.append(f"fit: group '{label}' logs no {key!r}")
            continue
        c = np.concatenate([p[0] for p in points])
        y = np.concatenate([p[1] for p in points])
        upper = 1.0 if y.min() >= 0.0 and y.max() <= 1.0 else None  # a rate cannot pass 1
        if c.size < MIN_POINTS:
            notes.append(
                f"fit: group '{label}' has {c.size} evaluation(s) of {key!r}; need at least "
                f"{MIN_POINTS} (evaluate more often: run.eval_every)"
            )
            continue
        try:
            params, r0_fitted, rmse = fit_sigmoid(c, y, upper=upper)
        except ValueError as e:
            notes.append(f"fit: group '{label}': {e}")
            continue
        intervals, failed = _bootstrap(points, params, upper, reps, seed)
        fit = SigmoidFit(params, intervals, c, y, len(points), r0_fitted, rmse)
        if failed:
            fit.notes.append(f"{failed} of {reps} bootstrap fits did not converge")
        if params["C_mid"] > c.max():
            fit.notes.append(
                "C_mid lies beyond the largest compute observed: A is an extrapolation; "
                "train longer before trusting it"
            )
        if upper is not None and params["A"] > upper - 1e-6:
            fit.notes.append(f"A sits at its bound {upper:g}: the data do not pin the asymptote")
        if len(points) == 1:
            fit.notes.append("one run: intervals resample the fit's residuals, not seeds")
        fits[label] = fit
    return fits, notes


# --------------------------------------------------------------------------- report


def plot_fits(fits: Mapping[str, SigmoidFit], key: str, compute: str, path: str | Path) -> Path:
    """Points and fitted curve per group, log-x; the asymptote A dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    positive = np.concatenate([f.compute[f.compute > 0] for f in fits.values()])
    lo = positive.min() / 2 if positive.size else 1.0
    hi = max(positive.max() if positive.size else 1.0, *(f.params["C_mid"] for f in fits.values()))
    grid = np.geomspace(lo, hi * 4, 200)
    for label, fit in fits.items():
        p = fit.params
        shown = fit.compute > 0
        (line,) = ax.plot(
            grid,
            fit.predict(grid),
            label=f"{label}: A={p['A']:.3g}, C_mid={p['C_mid']:.3g}, B={p['B']:.2f}",
        )
        ax.scatter(fit.compute[shown], fit.values[shown], color=line.get_color(), s=12, alpha=0.6)
        ax.axhline(p["A"], color=line.get_color(), linestyle="--", linewidth=0.8)
        ax.axhline(p["R0"], color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"RL compute ({compute})")
    ax.set_ylabel(key)
    ax.set_title("R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def _cell(fit: SigmoidFit, name: str) -> str:
    value = f"{fit.params[name]:.4g}"
    if name in fit.intervals:
        lo, hi = fit.intervals[name]
        value += f" [{lo:.4g}, {hi:.4g}]"
    if name == "R0" and not fit.r0_fitted:
        value += " (measured)"
    return value


def to_markdown(fits: Mapping[str, SigmoidFit], key: str, compute: str) -> str:
    lines = [
        f"## Sigmoid fit of {key} against {compute}",
        "",
        "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); 95% bootstrap intervals in brackets.",
        "",
        "| group | runs | points | A (asymptote) | C_mid (midpoint) | B (slope) | R0 | RMSE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, f in fits.items():
        cells = [_cell(f, n) for n in PARAMS]
        row = [label, str(f.n_runs), str(f.compute.size), *cells, f"{f.rmse:.3g}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    for label, f in fits.items():
        lines += [f"- {label}: {n}" for n in f.notes]
    return "\n".join(lines) + "\n"


def run_fit(
    paths: Sequence[str],
    metric: str,
    compute: str,
    out_dir: str | None,
    fmt: str = "table",
    *,
    reps: int = 200,
    seed: int = 0,
) -> int:
    """CLI entry of ``streamrl compare --fit sigmoid``: fit, print, write files.

    Returns 0 when every group was fitted, 1 on bad input or when no group could be.
    """
    import json
    import sys

    from streamrl.analysis.compare import CompareError, completed_runs, group_runs, series_key
    from streamrl.analysis.runs import parse_metric

    notes: list[str] = []
    try:
        runs, skipped = completed_runs(paths)
        notes += [f"skipped {d}: {why}" for d, why in skipped.items()]
        key = series_key(parse_metric(metric)[1], runs, [])
        fits, fit_notes = fit_groups(group_runs(runs), key, compute, reps=reps, seed=seed)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    notes += fit_notes
    if fmt == "json":
        doc = {"metric": key, "compute": compute, "notes": notes}
        doc["fits"] = {g: f.to_dict() for g, f in fits.items()}
        print(json.dumps(doc, indent=2))
    else:
        print(to_markdown(fits, key, compute) + "".join(f"- {n}\n" for n in notes), end="")
    if out_dir is not None and fits:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "fit.md", to_markdown(fits, key, compute))
        plot_fits(fits, key, compute, out / "sigmoid_fit.png")
        print(f"wrote {out / 'fit.md'} and {out / 'sigmoid_fit.png'}", file=sys.stderr)
    if not fits:
        print("error: no group could be fitted (see the notes above)", file=sys.stderr)
        return 1
    return 0

"""`streamrl compare`: are these recipes different, with enough seeds to say so?

Reads run directories written by `streamrl train` (see `runs`), skips the runs that did
not complete (failed, interrupted or unfinished: one note each), groups the rest into
recipes (configs that are equal once ``seed``, ``run.name`` and ``run.output_dir`` are
removed), and computes per recipe the mean and IQM with stratified-bootstrap CIs, per pair
of recipes the probability of improvement and AdaStop's verdict (see `stats`), plus the
learning curves. `report` renders the result and writes the plots.

A metric name resolves, per run, to a ``summary.json`` key or a ``metrics.jsonl`` key
(see `runs`; prefix ``metrics.jsonl:`` or ``summary.json:`` to pick the source).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.analysis import plots, report, stats
from streamrl.analysis.runs import (
    METRICS,
    Run,
    RunError,
    find_run_dirs,
    flatten,
    load_run,
    parse_metric,
    unusable_reason,
)

__all__ = [
    "CompareError",
    "ComparisonResult",
    "PairResult",
    "Run",
    "compare",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "recipe",
    "run_compare",
]

IGNORED_KEYS = ("seed", "run.name", "run.output_dir")  # do not define a recipe
MAX_CURVE_POINTS = 200  # learning curves are bootstrapped on at most this many steps
UNSET = "<unset>"

# Bad input to `compare`; the message names the offending directory or metric. The same
# class as `runs.RunError`, so it also covers errors from reading a run directory.
CompareError = RunError


# --------------------------------------------------------------------------- grouping


def recipe(run: Run) -> dict[str, Any]:
    """The run's flattened config (dotted keys) without the keys that do not define a recipe."""
    return {k: v for k, v in flatten(run.config).items() if k not in IGNORED_KEYS}


def _differing(recipes: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = sorted(set().union(*recipes))
    return [k for k in keys if len({json.dumps(r.get(k, UNSET), default=str) for r in recipes}) > 1]


def _describe(groups: Mapping[str, list[Run]]) -> dict[str, dict[str, Any]]:
    """Per group (same keys as ``groups``), the config keys that differ between groups."""
    recipes = {g: recipe(runs[0]) for g, runs in groups.items()}
    keys = _differing(list(recipes.values()))
    return {g: {k: r.get(k, UNSET) for k in keys} for g, r in recipes.items()}


def _label(diff: Mapping[str, Any], max_keys: int = 3) -> str:
    parts = [f"{k}={report.show(v)}" for k, v in diff.items()]
    if len(parts) > max_keys:
        parts = parts[:max_keys] + [f"(+{len(parts) - max_keys} more)"]
    return ", ".join(parts) or "all runs"


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Group runs by recipe; the label lists the config keys that differ between groups.

    Runs inside a group are ordered by (seed, path), the order AdaStop consumes them in.
    """
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps(recipe(run), sort_keys=True, default=str)
        by_key.setdefault(key, []).append(run)
    diffs = _describe(by_key)
    labelled: dict[str, list[Run]] = {}
    for i, (key, members) in enumerate(sorted(by_key.items(), key=lambda kv: _label(diffs[kv[0]]))):
        label = _label(diffs[key])
        if label in labelled:  # shortened labels can collide
            label = f"{label} #{i + 1}"
        labelled[label] = sorted(members, key=_seed_order)
    return labelled


def _seed_order(run: Run) -> tuple[int, int, str, str]:
    """Sort key: integer seeds numerically (2 before 10), then anything else, then path."""
    seed = run.seed
    if isinstance(seed, int) and not isinstance(seed, bool):
        return (0, seed, "", str(run.path))
    return (1, 0, str(seed), str(run.path))


# --------------------------------------------------------------------------- comparison


@dataclass
class PairResult:
    """Group ``a`` against group ``b``: P(a > b) with its CI, and AdaStop's verdict."""

    a: str
    b: str
    p_improvement: tuple[float, float, float]
    verdict: str  # "equal" | "larger" (a > b) | "smaller" (a < b) | "continue"
    more_seeds: int  # further seeds per group AdaStop needs, when verdict is "continue"

    @property
    def verdict_text(self) -> str:
        return {
            "larger": f"{self.a} > {self.b}",
            "smaller": f"{self.a} < {self.b}",
            "equal": "no significant difference",
            "continue": f"undecided: run {self.more_seeds} more seeds per group",
        }[self.verdict]


@dataclass
class ComparisonResult:
    """Everything `compare` computed; `report` renders it (or `to_markdown`, `print_rich`)."""

    metric: str
    groups: dict[str, list[Run]]
    group_configs: dict[str, dict[str, Any]]  # label -> differing config keys
    scores: dict[str, np.ndarray]  # label -> final score per run, shape (n_runs,)
    intervals: dict[str, dict[str, tuple[float, float, float]]]
    pairs: list[PairResult]
    adastop: stats.AdaStopResult | None
    curves: dict[str, plots.Curve] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    curve_key: str = ""  # the metrics.jsonl key of the learning curves
    skipped: dict[Path, str] = field(default_factory=dict)  # run dir -> why it was left out

    def adastop_summary(self) -> str:
        return report.adastop_summary(self)

    def to_markdown(self) -> str:
        return report.to_markdown(self)

    def to_dict(self) -> dict[str, Any]:
        return report.to_dict(self)

    def print_rich(self, console: Any = None) -> None:
        report.print_rich(self, console)


def _learning_curve(runs: Sequence[Run], key: str, reps: int, seed: int) -> plots.Curve | None:
    """Mean curve with bootstrap band on the steps that every run covers, or None."""
    series = [r.series(key) for r in runs]
    if any(steps.size == 0 for steps, _ in series):
        return None
    start = max(steps[0] for steps, _ in series)
    end = min(steps[-1] for steps, _ in series)
    grid = np.unique(np.concatenate([s for s, _ in series]))
    grid = grid[(grid >= start) & (grid <= end)]
    if grid.size == 0:
        return None
    if grid.size > MAX_CURVE_POINTS:
        grid = grid[np.linspace(0, grid.size - 1, MAX_CURVE_POINTS).round().astype(int)]
    # Runs logged at different steps (e.g. eval every N): interpolate onto a shared grid.
    curves = np.stack([np.interp(grid, s, v) for s, v in series])  # (n_runs, n_points)
    center, lo, hi = stats.bootstrap_curve(curves, reps=reps, seed=seed)
    return plots.Curve(steps=grid, center=center, lo=lo, hi=hi, n_runs=len(runs))


def series_key(key: str, runs: Sequence[Run], notes: list[str]) -> str:
    """The metrics.jsonl key whose series is the learning curve of ``key``.

    A summary scalar ``eval_X_after`` / ``eval_X_before`` (as `streamrl train` writes) is
    not logged per step; its series is ``eval/X``.
    """
    if any(r.series(key)[0].size for r in runs):
        return key
    match = re.fullmatch(r"eval_(.+)_(?:after|before)", key)
    if match and any(r.series(f"eval/{match[1]}")[0].size for r in runs):
        notes.append(f"learning curves show eval/{match[1]}, the per-step series of {key!r}")
        return f"eval/{match[1]}"
    return key


def _check_groups(groups: Mapping[str, list[Run]], metric: str) -> list[str]:
    """Raise on groups too small for CIs; return notes on suspicious groups."""
    single = {g: runs[0].path for g, runs in groups.items() if len(runs) < 2}
    if single:
        listing = "; ".join(f"group '{g}' has 1 run ({p})" for g, p in single.items())
        raise CompareError(
            f"{listing}: need at least 2 seeds per group to compute confidence intervals "
            f"for {metric!r}; run more seeds of that recipe"
        )
    notes = []
    for g, runs in groups.items():
        seeds = [r.seed for r in runs]
        repeated = sorted({str(s) for s in seeds if seeds.count(s) > 1})
        if repeated:
            notes.append(f"group '{g}' repeats seed(s) {', '.join(repeated)}: duplicated runs?")
    return notes


def completed_runs(run_dirs: Sequence[str | Path]) -> tuple[list[Run], dict[Path, str]]:
    """The completed runs found in ``run_dirs``, and why each other run was skipped."""
    runs, skipped = [], {}
    for d in find_run_dirs(run_dirs):
        reason = unusable_reason(d)
        if reason is None:
            runs.append(load_run(d))
        else:
            skipped[d] = reason
    if not runs:
        raise CompareError(
            "no completed run to compare: every run directory was skipped\n"
            + "\n".join(f"skipped {d}: {why}" for d, why in skipped.items())
        )
    return runs, skipped


def compare(
    run_dirs: Sequence[str | Path],
    metric: str,
    *,
    out_dir: str | Path | None = None,
    reps: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
    adastop_n_per_stage: int = 5,
    adastop_stages: int = 5,
    console: Any = None,
) -> ComparisonResult:
    """Compare the recipes found in ``run_dirs`` on ``metric``.

    Args:
        run_dirs: run directories, or parents of run directories.
        metric: a summary.json key, or a metrics.jsonl key (``metrics.jsonl:KEY`` forces it).
        out_dir: if set, write ``comparison.md``, ``learning_curves.png``, ``intervals.png``.
        reps: bootstrap replications for every CI.
        seed: seed of the bootstrap and of AdaStop's permutations.
        alpha, adastop_n_per_stage, adastop_stages: AdaStop's fixed design (see `stats`).
        console: a Rich console to print the tables on, if given.

    Failed, interrupted and unfinished runs are left out, with a note naming each (in
    ``notes`` and ``skipped``). With a single group there is nothing to compare: its
    intervals are still reported and a note says so. Raises `CompareError` on unusable
    input, or when no completed run is left.
    """
    runs, skipped = completed_runs(run_dirs)
    try:
        result = _compare(runs, metric, reps, seed, alpha, adastop_n_per_stage, adastop_stages)
    except CompareError as e:
        if not skipped:
            raise
        listing = "\n".join(f"skipped {d}: {why}" for d, why in skipped.items())
        raise CompareError(f"{e}\n{listing}") from e
    result.skipped = skipped
    result.notes[:0] = [f"skipped {d}: {why}" for d, why in skipped.items()]
    if out_dir is not None:
        report.write_report(result, out_dir)
    if console is not None:
        report.print_rich(result, console)
    return result


def _final_scores(runs: Sequence[Run], metric: str) -> dict[Path, float]:
    """Every run's final ``metric``; one error listing (up to 5) the runs that lack it."""
    missing = []
    scores_by_run: dict[Path, float] = {}
    for run in runs:
        try:
            scores_by_run[run.path] = run.final_score(metric)
        except CompareError as e:
            missing.append(str(e))
    if missing:
        more = f" (and {len(missing) - 5} more runs)" if len(missing) > 5 else ""
        raise CompareError("\n".join(missing[:5]) + more)
    return scores_by_run


def _pairwise(
    scores: dict[str, np.ndarray],
    reps: int,
    seed: int,
    alpha: float,
    adastop_n_per_stage: int,
    adastop_stages: int,
) -> tuple[list[PairResult], stats.AdaStopResult]:
    """AdaStop's decisions over all groups, and each pair's improvement interval."""
    adastop = stats.adastop_decision(
        scores, adastop_n_per_stage, adastop_stages, alpha=alpha, seed=seed
    )
    pairs: list[PairResult] = []
    for a, b in itertools.combinations(scores, 2):
        verdict = adastop.decisions[(a, b)]
        more = max(adastop.more_seeds.get(a, 0), adastop.more_seeds.get(b, 0))
        poi = stats.improvement_interval(scores[a], scores[b], reps=reps, seed=seed)
        pairs.append(PairResult(a, b, poi, verdict, more))
    return pairs, adastop


def _learning_curves(
    groups: dict[str, list[Run]], key: str, reps: int, seed: int, notes: list[str]
) -> dict[str, plots.Curve]:
    """Each group's learning curve of ``key``; a note names the groups that have none."""
    curves = {g: _learning_curve(rs, key, reps, seed) for g, rs in groups.items()}
    no_curve = [g for g, c in curves.items() if c is None]
    if no_curve:
        which = "any group" if len(no_curve) == len(groups) else ", ".join(no_curve)
        notes.append(
            f"no learning curve for {which}: {key!r} is not logged over a common step range "
            f"in every run's {METRICS}"
        )
    return {g: c for g, c in curves.items() if c is not None}


def _compare(
    runs: Sequence[Run],
    metric: str,
    reps: int,
    seed: int,
    alpha: float,
    adastop_n_per_stage: int,
    adastop_stages: int,
) -> ComparisonResult:
    scores_by_run = _final_scores(runs, metric)
    groups = group_runs(runs)
    notes = _check_groups(groups, metric)
    scores = {g: np.array([scores_by_run[r.path] for r in rs]) for g, rs in groups.items()}
    intervals = stats.interval_estimates(scores, reps=reps, seed=seed)

    pairs: list[PairResult] = []
    adastop = None
    if len(groups) < 2:
        notes.insert(
            0,
            f"only one group ('{next(iter(groups))}'): all runs share one recipe once "
            "seed/run.name/run.output_dir are ignored, so there is nothing to compare; "
            "showing its intervals only. Pass runs of at least 2 recipes to compare them.",
        )
    else:
        pairs, adastop = _pairwise(scores, reps, seed, alpha, adastop_n_per_stage, adastop_stages)

    key = series_key(parse_metric(metric)[1], runs, notes)
    curves = _learning_curves(groups, key, reps, seed, notes)
    return ComparisonResult(
        metric,
        groups,
        _describe(groups),
        scores,
        intervals,
        pairs,
        adastop,
        curves,
        notes=notes,
        curve_key=key,
    )


def run_compare(
    paths: list[str],
    metric: str,
    out_dir: str | None,
    fmt: str = "table",
    *,
    reps: int = 2000,
    seed: int = 0,
) -> int:
    """CLI entry: compare, print in ``fmt`` ("table", "markdown" or "json"), write files.

    Returns 0 on success, 1 on bad input (the error is printed to stderr), 2 on a bad ``fmt``.
    """
    if fmt not in report.FORMATS:
        print(f"error: unknown format {fmt!r} (use table, markdown or json)", file=sys.stderr)
        return 2
    try:
        result = compare(paths, metric, out_dir=out_dir, reps=reps, seed=seed)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    report.print_result(result, fmt)
    return 0

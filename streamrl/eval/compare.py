"""`streamrl compare`: are these recipes different, with enough seeds to say so?

Reads run directories written by `streamrl train`, groups them into recipes (configs that
are equal once ``seed``, ``run.name`` and ``run.output_dir`` are removed), and reports per
recipe the mean and IQM with stratified-bootstrap CIs, per pair of recipes the probability
of improvement and AdaStop's verdict, plus learning-curve and interval plots.

A metric name resolves, per run, to a ``summary.json`` key (the final scalar) or else to a
``metrics.jsonl`` key (its last logged value is the final score, its series the learning
curve). Prefix ``metrics.jsonl:`` or ``summary.json:`` to pick the source explicitly.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from streamrl.eval import plots, stats

__all__ = [
    "CompareError",
    "ComparisonResult",
    "PairResult",
    "Run",
    "compare",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "run_compare",
]

CONFIG, METRICS, SUMMARY = "config.yaml", "metrics.jsonl", "summary.json"
IGNORED_KEYS = ("seed", "run.name", "run.output_dir")  # do not define a recipe
MAX_CURVE_POINTS = 200  # learning curves are bootstrapped on at most this many steps
UNSET = "<unset>"


class CompareError(ValueError):
    """Bad input to `compare`; the message names the offending directory or metric."""


# --------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One run directory: resolved config, metrics (one record per step), summary."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]  # sorted by step; the last record of a repeated step wins
    summary: dict[str, Any]
    has_summary: bool = True

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def recipe(self) -> dict[str, Any]:
        """Flattened config (dotted keys) without the keys that do not define a recipe."""
        flat = _flatten(self.config)
        return {k: v for k, v in flat.items() if k not in IGNORED_KEYS}

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and finite values of ``key`` in metrics.jsonl, each shape (n_logged,)."""
        pairs = [(r["step"], _number(r.get(key))) for r in self.metrics]
        pairs = [(s, v) for s, v in pairs if v is not None]
        steps = np.array([s for s, _ in pairs], dtype=np.float64)
        return steps, np.array([v for _, v in pairs], dtype=np.float64)

    def final_score(self, metric: str) -> float:
        """The run's final value of ``metric`` (see the module docstring for resolution)."""
        source, key = _parse_metric(metric)
        if source in ("auto", "summary"):
            value = _number(self.summary.get(key))
            if value is not None:
                return value
        if source in ("auto", "metrics"):
            _, values = self.series(key)
            if values.size:
                return float(values[-1])
        where = {"auto": f"{SUMMARY} or {METRICS}", "summary": SUMMARY, "metrics": METRICS}
        known = sorted(set(self.summary) | {k for r in self.metrics for k in r})
        close = difflib.get_close_matches(key, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CompareError(f"{self.path}: metric {key!r} not found in {where[source]}{hint}")


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, non-numeric, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _parse_metric(metric: str) -> tuple[str, str]:
    for prefix, source in ((f"{METRICS}:", "metrics"), (f"{SUMMARY}:", "summary")):
        if metric.startswith(prefix):
            return source, metric[len(prefix) :]
    return "auto", metric


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_run(path: str | Path) -> Run:
    """Read one run directory; raise `CompareError` naming the file (and line) on bad input."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"{path}: no such directory")
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory")
    missing = [f for f in (CONFIG, METRICS) if not (path / f).is_file()]
    if missing:
        raise CompareError(
            f"{path}: not a run directory (missing {', '.join(missing)}; a run written by "
            f"`streamrl train` has {CONFIG}, {METRICS} and {SUMMARY})"
        )
    try:
        config = yaml.safe_load((path / CONFIG).read_text())
    except yaml.YAMLError as e:
        raise CompareError(f"{path / CONFIG}: invalid YAML: {e}") from e
    if not isinstance(config, dict):
        raise CompareError(f"{path / CONFIG}: expected a mapping, got {type(config).__name__}")

    by_step: dict[int, dict[str, Any]] = {}
    with open(path / METRICS) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise CompareError(f"{path / METRICS}:{lineno}: invalid JSON: {e}") from e
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise CompareError(f"{path / METRICS}:{lineno}: expected an object with int 'step'")
            by_step[record["step"]] = record  # a restarted run repeats steps: last one wins
    metrics = [by_step[s] for s in sorted(by_step)]

    summary: dict[str, Any] = {}
    has_summary = (path / SUMMARY).is_file()
    if has_summary:
        try:
            summary = json.loads((path / SUMMARY).read_text())
        except json.JSONDecodeError as e:
            raise CompareError(f"{path / SUMMARY}: invalid JSON: {e}") from e
        if not isinstance(summary, dict):
            raise CompareError(f"{path / SUMMARY}: expected a JSON object")
    return Run(path=path, config=config, metrics=metrics, summary=summary, has_summary=has_summary)


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories named by ``paths``: each is a run or a parent of runs (one level)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"{p}: no such directory")
        if not p.is_dir():
            raise CompareError(f"{p}: not a directory")
        if (p / CONFIG).exists() or (p / METRICS).exists():
            found.append(p)  # load_run says what is missing, if anything
            continue
        children = sorted(c for c in p.iterdir() if c.is_dir() and (c / CONFIG).exists())
        if not children:
            what = "empty directory" if not any(p.iterdir()) else "not a run directory"
            raise CompareError(
                f"{p}: {what}, and it holds no run directories (a run has {CONFIG} and {METRICS})"
            )
        found.extend(children)
    unique = list({d.resolve(): d for d in found}.values())
    if not unique:
        raise CompareError("no run directories given")
    return unique


# --------------------------------------------------------------------------- grouping


def _show(value: Any, width: int = 24) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _differing(recipes: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = sorted(set().union(*recipes))
    return [k for k in keys if len({json.dumps(r.get(k, UNSET), default=str) for r in recipes}) > 1]


def _describe(groups: Mapping[str, list[Run]]) -> dict[str, dict[str, Any]]:
    """Per group (same keys as ``groups``), the config keys that differ between groups."""
    recipes = {g: runs[0].recipe for g, runs in groups.items()}
    keys = _differing(list(recipes.values()))
    return {g: {k: r.get(k, UNSET) for k in keys} for g, r in recipes.items()}


def _label(diff: Mapping[str, Any], max_keys: int = 3) -> str:
    parts = [f"{k}={_show(v)}" for k, v in diff.items()]
    if len(parts) > max_keys:
        parts = parts[:max_keys] + [f"(+{len(parts) - max_keys} more)"]
    return ", ".join(parts) or "all runs"


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Group runs by recipe; the label lists the config keys that differ between groups.

    Runs inside a group are ordered by (seed, path), the order AdaStop consumes them in.
    """
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps(run.recipe, sort_keys=True, default=str)
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
    """Everything `compare` computed; render with `to_markdown` or `print_rich`."""

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

    def adastop_summary(self) -> str:
        a = self.adastop
        if a is None:
            return "AdaStop: not run (needs at least 2 groups)."
        design = (
            f"AdaStop (alpha={a.alpha}, {a.n_per_stage} seeds per stage, at most "
            f"{a.n_stages} stages): {a.stages_done} stage(s) done"
        )
        if a.stages_done and any(a.seeds_used[g] < len(r) for g, r in self.groups.items()):
            used = ", ".join(f"{a.seeds_used[g]} of {len(r)}" for g, r in self.groups.items())
            design += f" on the first runs by seed ({used} per group)"
        if a.finished:
            return design + "; all comparisons decided."
        return design + f"; run more seeds: {a.more_seeds_per_group} more per group."

    def group_rows(self) -> list[list[str]]:
        rows = []
        for label, runs in self.groups.items():
            iv = self.intervals[label]
            rows.append(
                [label, str(len(runs)), _fmt_interval(iv["mean"]), _fmt_interval(iv["iqm"])]
            )
        return rows

    def pair_rows(self) -> list[list[str]]:
        return [
            [f"{p.a} vs {p.b}", _fmt_interval(p.p_improvement), p.verdict_text] for p in self.pairs
        ]

    def to_markdown(self) -> str:
        lines = [f"# Comparison of `{self.metric}`", ""]
        lines += _md_table(["group", "seeds", "mean [95% CI]", "IQM [95% CI]"], self.group_rows())
        if self.pairs:
            lines += [""] + _md_table(
                ["pair (A vs B)", "P(A > B) [95% CI]", "AdaStop"], self.pair_rows()
            )
        lines += ["", self.adastop_summary()]
        lines += ["", "## Groups", ""]
        for label, runs in self.groups.items():
            lines.append(f"- **{label}**: {', '.join(f'`{r.path}`' for r in runs)}")
            for k, v in self.group_configs[label].items():
                lines.append(f"  - `{k}` = `{_show(v, width=200)}`")
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        figures = [f for f in self.files if f.suffix == ".png"]
        if figures:
            lines += ["", "## Figures", ""] + [f"![{f.stem}]({f.name})" for f in figures]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "groups": {
                g: {
                    "runs": [str(r.path) for r in runs],
                    "config": self.group_configs[g],
                    "scores": self.scores[g].tolist(),
                    **{k: list(v) for k, v in self.intervals[g].items()},
                }
                for g, runs in self.groups.items()
            },
            "pairs": [
                {"a": p.a, "b": p.b, "p_improvement": list(p.p_improvement), "adastop": p.verdict}
                for p in self.pairs
            ],
            "adastop": self.adastop_summary(),
            "notes": self.notes,
            "files": [str(f) for f in self.files],
        }

    def print_rich(self, console: Any = None) -> None:
        """Print the tables, AdaStop summary and notes with Rich."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=f"{self.metric}: per group (95% stratified-bootstrap CIs)")
        table.add_column("group", overflow="fold")
        for col in ("seeds", "mean [95% CI]", "IQM [95% CI]"):
            table.add_column(col, justify="right", no_wrap=True)
        for row in self.group_rows():
            table.add_row(*row)
        console.print(table)
        if self.pairs:
            table = Table(title=f"{self.metric}: pairwise")
            table.add_column("pair (A vs B)", overflow="fold")
            table.add_column("P(A > B) [95% CI]", no_wrap=True)
            table.add_column("AdaStop", overflow="fold")
            for row in self.pair_rows():
                table.add_row(*row)
            console.print(table)
        console.print(self.adastop_summary(), markup=False)
        for note in self.notes:
            console.print(f"note: {note}", style="yellow", markup=False)
        for f in self.files:
            console.print(f"wrote {f}", markup=False)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if x != 0 and not 1e-3 <= abs(x) < 1e3 else f"{x:.3f}"


def _fmt_interval(iv: tuple[float, float, float]) -> str:
    point, lo, hi = iv
    return f"{_fmt(point)} [{_fmt(lo)}, {_fmt(hi)}]"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]


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


def _series_key(key: str, runs: Sequence[Run], notes: list[str]) -> str:
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
        unfinished = [str(r.path) for r in runs if not r.has_summary]
        if unfinished:
            notes.append(f"group '{g}': no {SUMMARY} (unfinished?) in {', '.join(unfinished)}")
    return notes


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

    With a single group there is nothing to compare: its intervals are still reported and
    a note says so. Raises `CompareError` on unusable input.
    """
    runs = [load_run(d) for d in find_run_dirs(run_dirs)]
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

    groups = group_runs(runs)
    notes = _check_groups(groups, metric)
    group_configs = _describe(groups)
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
        adastop = stats.adastop_decision(
            scores, adastop_n_per_stage, adastop_stages, alpha=alpha, seed=seed
        )
        for a, b in itertools.combinations(groups, 2):
            verdict = adastop.decisions[(a, b)]
            more = max(adastop.more_seeds.get(a, 0), adastop.more_seeds.get(b, 0))
            poi = stats.improvement_interval(scores[a], scores[b], reps=reps, seed=seed)
            pairs.append(PairResult(a, b, poi, verdict, more))

    _, key = _parse_metric(metric)
    key = _series_key(key, runs, notes)
    curves = {g: _learning_curve(rs, key, reps, seed) for g, rs in groups.items()}
    no_curve = [g for g, c in curves.items() if c is None]
    if no_curve:
        which = "any group" if len(no_curve) == len(groups) else ", ".join(no_curve)
        notes.append(
            f"no learning curve for {which}: {key!r} is not logged over a common step range "
            f"in every run's {METRICS}"
        )
    curves = {g: c for g, c in curves.items() if c is not None}

    result = ComparisonResult(
        metric, groups, group_configs, scores, intervals, pairs, adastop, curves, notes=notes
    )
    if out_dir is not None:
        out = Path(out_dir)
        if curves:
            result.files.append(
                plots.plot_learning_curves(curves, key, out / "learning_curves.png")
            )
        result.files.append(plots.plot_intervals(intervals, key, out / "intervals.png"))
        (out / "comparison.md").write_text(result.to_markdown())
        result.files.append(out / "comparison.md")
    if console is not None:
        result.print_rich(console)
    return result


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
    if fmt not in ("table", "markdown", "json"):
        print(f"error: unknown format {fmt!r} (use table, markdown or json)", file=sys.stderr)
        return 2
    try:
        result = compare(paths, metric, out_dir=out_dir, reps=reps, seed=seed)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if fmt == "table":
        result.print_rich()
    elif fmt == "markdown":
        print(result.to_markdown(), end="")
    else:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    return 0

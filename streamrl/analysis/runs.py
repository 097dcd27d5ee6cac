"""Reading run directories written by `streamrl train`.

Shared by ``streamrl compare``, ``streamrl plot``, ``streamrl eval`` and the metric
sinks. A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``
(one JSON object per logged step) and, once the run has ended, ``summary.json``. The
summary's ``status`` is ``"completed"``, ``"failed"`` (with ``"error"``) or
``"interrupted"``; summaries written before the status existed count as completed, and
a run without a summary is unfinished (still running, or killed).

A metric name resolves, per run, to a ``summary.json`` key (the final scalar) or else to a
``metrics.jsonl`` key (its last logged value is the final score, its series the learning
curve). Prefix ``metrics.jsonl:`` or ``summary.json:`` to pick the source explicitly.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

__all__ = [
    "COMPLETED",
    "CONFIG",
    "METRICS",
    "SUMMARY",
    "Run",
    "RunError",
    "find_run_dirs",
    "flatten",
    "load_metrics",
    "load_run",
    "parse_metric",
    "read_summary",
    "status_problem",
    "unusable_reason",
]

CONFIG, METRICS, SUMMARY = "config.yaml", "metrics.jsonl", "summary.json"
COMPLETED = "completed"  # summary.json "status" of a run that finished


class RunError(ValueError):
    """An unusable run directory or metric; the message names the file (and line)."""


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

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and finite values of ``key`` in metrics.jsonl, each shape (n_logged,)."""
        pairs = [(r["step"], _number(r.get(key))) for r in self.metrics]
        pairs = [(s, v) for s, v in pairs if v is not None]
        steps = np.array([s for s, _ in pairs], dtype=np.float64)
        return steps, np.array([v for _, v in pairs], dtype=np.float64)

    def final_score(self, metric: str) -> float:
        """The run's final value of ``metric`` (see the module docstring for resolution)."""
        source, key = parse_metric(metric)
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
        raise RunError(f"{self.path}: metric {key!r} not found in {where[source]}{hint}")


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, non-numeric, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def parse_metric(metric: str) -> tuple[str, str]:
    """``(source, key)``: source is "metrics", "summary" or "auto" (no prefix)."""
    for prefix, source in ((f"{METRICS}:", "metrics"), (f"{SUMMARY}:", "summary")):
        if metric.startswith(prefix):
            return source, metric[len(prefix) :]
    return "auto", metric


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as one level of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` sorted by step; a repeated step's last row wins.

    Raises `RunError` naming the file and line on a malformed row.
    """
    path = Path(run_dir) / METRICS
    by_step: dict[int, dict[str, Any]] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunError(f"{path}:{lineno}: invalid JSON: {e}") from e
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise RunError(f"{path}:{lineno}: expected an object with int 'step'")
            by_step[record["step"]] = record  # a restarted run repeats steps: last one wins
    return [by_step[s] for s in sorted(by_step)]


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """``run_dir/summary.json``, or None when the run has not written one."""
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: invalid JSON: {e}") from e
    if not isinstance(summary, dict):
        raise RunError(f"{path}: expected a JSON object")
    return summary


def status_problem(summary: Mapping[str, Any] | None) -> str | None:
    """Why a run with this summary has no final result, in a few words, or None."""
    if summary is None:
        return f"unfinished (no {SUMMARY}: still running, or killed)"
    status = summary.get("status", COMPLETED)  # older runs have no status: completed
    if status == COMPLETED:
        return None
    error = " ".join(str(summary.get("error") or "").split())  # one line
    if len(error) > 200:
        error = error[:199] + "…"
    return f"{status} ({error})" if error else str(status)


def _check_dir(path: Path) -> None:
    if not path.exists():
        raise RunError(f"{path}: no such directory")
    if not path.is_dir():
        raise RunError(f"{path}: not a directory")
    missing = [f for f in (CONFIG, METRICS) if not (path / f).is_file()]
    if missing:
        raise RunError(
            f"{path}: not a run directory (missing {', '.join(missing)}; a run written by "
            f"`streamrl train` has {CONFIG}, {METRICS} and {SUMMARY})"
        )


def unusable_reason(path: str | Path) -> str | None:
    """Why the run at ``path`` has no final result (failed, interrupted, unfinished), or None.

    Reads only ``summary.json``, so a failed run need not have any metrics. A directory
    without a summary that is not a run directory at all raises `RunError`.
    """
    path = Path(path)
    summary = read_summary(path) if path.is_dir() else None
    if summary is None:
        _check_dir(path)
    return status_problem(summary)


def load_run(path: str | Path) -> Run:
    """Read one run directory; raise `RunError` naming the file (and line) on bad input."""
    path = Path(path)
    _check_dir(path)
    try:
        config = yaml.safe_load((path / CONFIG).read_text())
    except yaml.YAMLError as e:
        raise RunError(f"{path / CONFIG}: invalid YAML: {e}") from e
    if not isinstance(config, dict):
        raise RunError(f"{path / CONFIG}: expected a mapping, got {type(config).__name__}")
    metrics = load_metrics(path)
    summary = read_summary(path)
    return Run(
        path=path,
        config=config,
        metrics=metrics,
        summary=summary or {},
        has_summary=summary is not None,
    )


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories named by ``paths``: each is a run or a parent of runs (one level)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RunError(f"{p}: no such directory")
        if not p.is_dir():
            raise RunError(f"{p}: not a directory")
        if any((p / f).exists() for f in (CONFIG, METRICS, SUMMARY)):
            found.append(p)  # load_run says what is missing, if anything
            continue
        children = sorted(
            c
            for c in p.iterdir()
            if c.is_dir() and any((c / f).exists() for f in (CONFIG, SUMMARY))
        )
        if not children:
            what = "empty directory" if not any(p.iterdir()) else "not a run directory"
            raise RunError(
                f"{p}: {what}, and it holds no run directories (a run has {CONFIG} and {METRICS})"
            )
        found.extend(children)
    unique = list({d.resolve(): d for d in found}.values())
    if not unique:
        raise RunError("no run directories given")
    return unique

"""Rendering a `streamrl compare` result: Rich tables, Markdown, JSON, and the report files.

``write_report`` writes ``learning_curves.png`` and ``intervals.png`` (see `plots`) and
``comparison.md`` into a directory; ``print_result`` prints in the CLI's ``--format``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.analysis import plots
from streamrl.core.atomic import write_text

if TYPE_CHECKING:
    from streamrl.analysis.compare import ComparisonResult

__all__ = [
    "FORMATS",
    "adastop_summary",
    "print_result",
    "print_rich",
    "show",
    "to_dict",
    "to_markdown",
    "write_report",
]

FORMATS = ("table", "markdown", "json")


def show(value: Any, width: int = 24) -> str:
    """A config value as short text: strings as they are, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


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


def adastop_summary(result: ComparisonResult) -> str:
    """One sentence: AdaStop's design, the stages done, and whether to run more seeds."""
    a = result.adastop
    if a is None:
        return "AdaStop: not run (needs at least 2 groups)."
    design = (
        f"AdaStop (alpha={a.alpha}, {a.n_per_stage} seeds per stage, at most "
        f"{a.n_stages} stages): {a.stages_done} stage(s) done"
    )
    groups = result.groups
    if a.stages_done and any(a.seeds_used[g] < len(r) for g, r in groups.items()):
        used = ", ".join(f"{a.seeds_used[g]} of {len(r)}" for g, r in groups.items())
        design += f" on the first runs by seed ({used} per group)"
    if a.finished:
        return design + "; all comparisons decided."
    return design + f"; run more seeds: {a.more_seeds_per_group} more per group."


def _group_rows(result: ComparisonResult) -> list[list[str]]:
    rows = []
    for label, runs in result.groups.items():
        iv = result.intervals[label]
        rows.append([label, str(len(runs)), _fmt_interval(iv["mean"]), _fmt_interval(iv["iqm"])])
    return rows


def _pair_rows(result: ComparisonResult) -> list[list[str]]:
    return [
        [f"{p.a} vs {p.b}", _fmt_interval(p.p_improvement), p.verdict_text] for p in result.pairs
    ]


def to_markdown(result: ComparisonResult) -> str:
    """The report as Markdown: tables, AdaStop summary, groups, notes and figures."""
    lines = [f"# Comparison of `{result.metric}`", ""]
    lines += _md_table(["group", "seeds", "mean [95% CI]", "IQM [95% CI]"], _group_rows(result))
    if result.pairs:
        lines += [""] + _md_table(
            ["pair (A vs B)", "P(A > B) [95% CI]", "AdaStop"], _pair_rows(result)
        )
    lines += ["", adastop_summary(result)]
    lines += ["", "## Groups", ""]
    for label, runs in result.groups.items():
        lines.append(f"- **{label}**: {', '.join(f'`{r.path}`' for r in runs)}")
        for k, v in result.group_configs[label].items():
            lines.append(f"  - `{k}` = `{show(v, width=200)}`")
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    figures = [f for f in result.files if f.suffix == ".png"]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{f.stem}]({f.name})" for f in figures]
    return "\n".join(lines) + "\n"


def to_dict(result: ComparisonResult) -> dict[str, Any]:
    """The result as JSON-ready data (``--format json``)."""
    return {
        "metric": result.metric,
        "groups": {
            g: {
                "runs": [str(r.path) for r in runs],
                "config": result.group_configs[g],
                "scores": result.scores[g].tolist(),
                **{k: list(v) for k, v in result.intervals[g].items()},
            }
            for g, runs in result.groups.items()
        },
        "pairs": [
            {"a": p.a, "b": p.b, "p_improvement": list(p.p_improvement), "adastop": p.verdict}
            for p in result.pairs
        ],
        "adastop": adastop_summary(result),
        "notes": result.notes,
        "files": [str(f) for f in result.files],
    }


def print_rich(result: ComparisonResult, console: Any = None) -> None:
    """Print the tables, AdaStop summary and notes with Rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{result.metric}: per group (95% stratified-bootstrap CIs)")
    table.add_column("group", overflow="fold")
    for col in ("seeds", "mean [95% CI]", "IQM [95% CI]"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in _group_rows(result):
        table.add_row(*row)
    console.print(table)
    if result.pairs:
        table = Table(title=f"{result.metric}: pairwise")
        table.add_column("pair (A vs B)", overflow="fold")
        table.add_column("P(A > B) [95% CI]", no_wrap=True)
        table.add_column("AdaStop", overflow="fold")
        for row in _pair_rows(result):
            table.add_row(*row)
        console.print(table)
    console.print(adastop_summary(result), markup=False)
    for note in result.notes:
        console.print(f"note: {note}", style="yellow", markup=False)
    for f in result.files:
        console.print(f"wrote {f}", markup=False)


def write_report(result: ComparisonResult, out_dir: str | Path) -> list[Path]:
    """Write the figures and ``comparison.md`` into ``out_dir``; add them to ``result.files``."""
    out = Path(out_dir)
    if result.curves:
        path = out / "learning_curves.png"
        result.files.append(plots.plot_learning_curves(result.curves, result.curve_key, path))
    result.files.append(
        plots.plot_intervals(result.intervals, result.curve_key, out / "intervals.png")
    )
    write_text(out / "comparison.md", to_markdown(result))
    result.files.append(out / "comparison.md")
    return result.files


def print_result(result: ComparisonResult, fmt: str) -> None:
    """Print ``result`` on stdout as a Rich "table", "markdown" or "json"."""
    if fmt == "table":
        print_rich(result)
    elif fmt == "markdown":
        print(to_markdown(result), end="")
    elif fmt == "json":
        print(json.dumps(to_dict(result), indent=2, default=str))
    else:
        raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")

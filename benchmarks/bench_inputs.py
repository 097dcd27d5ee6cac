"""What hostile inputs cost to read, before and after the bounds on them, in one process.

Each row runs the replaced code (kept here as the reference) and the current code on the
same input and reports both times and their ratio; a row the old code cannot finish in
reasonable time is run at sizes it can, to show the growth:

- answer extraction (``extract_answer``, used by the ``reasoning_gym`` reward): the old
  ``<answer>\\s*(.*?)\\s*</answer>`` on a tag followed by a run of whitespace (cubic), and
  on many unclosed tags (quadratic);
- ``ANSWER_TAG_PATTERN`` under ``format_reward``'s fullmatch: many unclosed tags;
- a config of nested YAML aliases (the "billion laughs"): the old reader's line walk
  visited every expanded value (2**levels); the current one stops at MAX_NODES;
- one large JSONL row: the old reader read and parsed the whole line (peak memory with
  tracemalloc); the current one refuses it after max_row_bytes + 2 bytes.

    PYTHONPATH=. python benchmarks/bench_inputs.py

Results: benchmarks/results/inputs.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from streamrl.config.reading import YamlError, read_yaml
from streamrl.rollout.rewards.functions import ANSWER_TAG_PATTERN, extract_answer
from streamrl.sources.base import DataError
from streamrl.sources.files import jsonl_records

OLD_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
OLD_PATTERN = re.compile(r"(?s).*<answer>.*?</answer>.*")
NEW_PATTERN = re.compile(ANSWER_TAG_PATTERN)


def old_extract(completion: str) -> str:
    tags = OLD_TAG.findall(completion)
    return tags[-1] if tags else completion.strip()


def old_yaml_lines(text: str) -> dict[tuple[str, ...], int]:
    """The old reader: safe_load, then a recursive walk recording the line of every key
    path, aliases expanded (what every later step, validation included, then walked)."""
    yaml.safe_load(text)
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                p = (*path, str(key_node.value))
                lines[p] = key_node.start_mark.line + 1
                walk(value_node, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                p = (*path, str(i))
                lines[p] = child.start_mark.line + 1
                walk(child, p)

    walk(yaml.compose(text), ())
    return lines


def laughs(levels: int) -> str:
    lines = ["l0: &l0 [x, x]"]
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def best(fn: Callable[[], Any], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with contextlib.suppress(YamlError, DataError):
            fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(name: str, size: str, old: float, new: float) -> str:
    ratio = f"{old / new:.1f}" if old < 10 * new else f"{old / new:.0f}"
    return f"| {name} | {size} | {old * 1e3:.2f} | {new * 1e3:.3f} | {ratio}x |"


def old_jsonl_peak(path: Path) -> int:
    tracemalloc.start()
    with path.open("rb") as f:
        for raw in f:
            json.loads(raw.decode("utf-8"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def new_jsonl_peak(path: Path) -> int:
    tracemalloc.start()
    with contextlib.suppress(DataError):
        list(jsonl_records(str(path)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    out = ["| input | size | old (ms) | new (ms) | old / new |", "|---|---|---|---|---|"]
    cases: list[tuple[str, str, Callable[[], Any], Callable[[], Any], int]] = []
    for n in (400, 800, 1600):
        text = "<answer>" + " " * n + "x"
        old, new = (lambda t=text: old_extract(t)), (lambda t=text: extract_answer(t))
        cases.append(("extract_answer: tag + spaces", f"{n} spaces", old, new, 1))
    for n in (1000, 2000, 4000):
        text = "<answer>" * n
        old, new = (lambda t=text: old_extract(t)), (lambda t=text: extract_answer(t))
        cases.append(("extract_answer: unclosed tags", f"{n} tags", old, new, 3))
        old, new = (
            (lambda t=text: OLD_PATTERN.fullmatch(t)),
            (lambda t=text: NEW_PATTERN.fullmatch(t)),
        )
        cases.append(("ANSWER_TAG_PATTERN fullmatch", f"{n} tags", old, new, 3))
    for levels in (14, 18, 22):
        text = laughs(levels)
        old, new = (lambda t=text: old_yaml_lines(t)), (lambda t=text: read_yaml(t))
        cases.append(("YAML aliases", f"{len(text)} chars, 2^{levels} values", old, new, 1))
    for name, size, old, new, repeat in cases:
        out.append(row(name, size, best(old, repeat), best(new)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.jsonl"
        path.write_text("[" + "0," * (10 << 20) + "0]\n")  # one 20 MiB row
        old_peak, new_peak = old_jsonl_peak(path), new_jsonl_peak(path)
        out.append(
            f"| JSONL row, peak memory (MiB) | {path.stat().st_size >> 20} MiB | "
            f"{old_peak / 2**20:.0f} | {new_peak / 2**20:.0f} | {old_peak / new_peak:.0f}x |"
        )
    print(f"python {sys.version.split()[0]}")
    print("\n".join(out))


if __name__ == "__main__":
    main()

"""What reading an input may cost: a config's YAML (nesting, aliases), a data row (bytes,
nesting), and the answer extraction run on every completion. Work is checked by counting
(values visited, bytes read), never by the clock; timings are in benchmarks/bench_inputs.py."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.config.reading import MAX_DEPTH, MAX_NODES, YamlError, read_yaml
from streamrl.rollout.rewards.functions import ANSWER_TAG_PATTERN, extract_answer
from streamrl.sources import DataError, build_task_source
from streamrl.sources.files import DEFAULT_MAX_ROW_BYTES, MAX_ROW_DEPTH, jsonl_records

# ------------------------------------------------------------ YAML


def _flat(n: int) -> str:
    return "data:\n  options:\n" + "".join(f"    k{i}: {i}\n" for i in range(n))


def _laughs(levels: int, width: int = 2) -> str:
    """Each level an alias list of ``width`` copies of the one before: width**levels
    values from a text of about 20 * levels characters."""
    lines = ["l0: &l0 [x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [10, 100, 1000, 10_000])
def test_reading_yaml_visits_each_value_once(n: int) -> None:
    doc = read_yaml(_flat(n))
    assert doc.nodes == 3 + n  # the root, data, options, and the n values: linear in n
    assert doc.lines[("data", "options", f"k{n - 1}")] == n + 2


def test_aliases_count_as_often_as_they_are_used() -> None:
    levels = 10
    doc = read_yaml(_laughs(levels))
    # the root, then level i holds 2**(i + 1) leaves under 2**(i + 1) - 1 lists
    assert doc.nodes == 1 + sum(2 ** (i + 2) - 1 for i in range(levels))


@pytest.mark.parametrize("levels", [20, 40, 60, 160])
def test_alias_expansion_is_capped(levels: int) -> None:
    """2**60 values written in 60 lines: the walk stops after MAX_NODES values (the test
    returning at all is the proof: 2**60 visits would never end); deeper, at MAX_DEPTH."""
    refused = f"more than {MAX_NODES} values once its aliases|nested more than {MAX_DEPTH}"
    with pytest.raises(YamlError, match=refused):
        read_yaml(_laughs(levels), "c.yaml")


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(YamlError, match=f"nested more than {MAX_DEPTH} levels deep"):
        read_yaml("a: &a [*a]\n")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_refused_without_recursion_errors(depth: int) -> None:
    for text in ("[" * depth + "]" * depth, "{a: " * depth + "1" + "}" * depth):
        with pytest.raises(YamlError, match=f"<yaml>:1: nested more than {MAX_DEPTH} levels"):
            read_yaml(text)
    assert read_yaml("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)).data is not None


def test_config_files_and_overrides_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(_laughs(40))
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: more than 100000 values"):
        load_config(path)
    deep = "[" * 1000 + "]" * 1000
    with pytest.raises(ConfigError, match="override data.options:1: nested more than 64"):
        load_config(None, [f"data.options={deep}"])
    with pytest.raises(ConfigError, match=r"c\.yaml:2: a: duplicate key \(first given at line 1"):
        path.write_text("a: 1\na: 2\n")
        load_config(path)


# ------------------------------------------------------------ data rows


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows))
    return path


def test_a_row_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    """The 9 MiB row is refused after max_row_bytes + 2 bytes: the message says how many
    were read. A row of exactly the limit is read."""
    limit = DEFAULT_MAX_ROW_BYTES
    row = json.dumps({"prompt": "x" * (limit - 20), "answer": "1"})
    exact = row.replace("x" * (len(row) - limit), "", 1)
    assert len(exact.encode()) == limit
    big = _write(tmp_path / "big.jsonl", ['{"prompt": "1+1=", "answer": "2"}', "x" * (9 << 20)])
    with pytest.raises(DataError, match=rf"big\.jsonl:2: the row takes at least {limit + 2} bytes"):
        list(jsonl_records(str(big)))
    ok = _write(tmp_path / "ok.jsonl", [exact, '{"prompt": "2+2=", "answer": "4"}'])
    assert [line for line, _, _ in jsonl_records(str(ok))] == [1, 2]
    with pytest.raises(DataError, match=r"ok\.jsonl:1: the row takes at least 1002 bytes"):
        build_task_source("jsonl", path=str(ok), max_row_bytes=1000)


def test_a_row_nested_too_deep_is_an_error_not_a_recursion_error(tmp_path: Path) -> None:
    for depth in (MAX_ROW_DEPTH + 1, 100_000):
        deep = "[" * depth + "]" * depth
        path = _write(tmp_path / "deep.jsonl", [f'{{"prompt": "a", "metadata": {{"x": {deep}}}}}'])
        with pytest.raises(DataError, match=rf"deep\.jsonl:1: nested more than {MAX_ROW_DEPTH}"):
            build_task_source("jsonl", path=str(path))


def test_table_rows_are_bounded_before_they_become_python_objects(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(100)]
    rows[70]["prompt"] = "9" * 5000 + "+1="
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet: row 70: the row takes \d+ bytes, more than"):
        build_task_source("parquet", path=str(tmp_path / "t.parquet"), max_row_bytes=4096)
    assert len(build_task_source("parquet", path=str(tmp_path / "t.parquet"), heldout_fraction=0))
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"saved: row 70: the row takes \d+ bytes, more than"):
        build_task_source("datasets", path=str(tmp_path / "saved"), max_row_bytes=4096)


# ------------------------------------------------------------ answer extraction

# the expressions these replaced, which backtracked cubically on a run of whitespace
# inside a tag, and quadratically on many unclosed tags: the reference semantics
OLD_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
OLD_PATTERN = re.compile(r"(?s).*<answer>.*?</answer>.*")


def _old_extract(completion: str) -> str:
    tags = OLD_TAG.findall(completion)
    return tags[-1] if tags else completion.strip()


def test_answer_extraction_means_what_the_regular_expressions_meant() -> None:
    rng = random.Random(0)
    parts = ["<answer>", "</answer>", "a", "7", " ", "\n", "\u00a0", "<answ", "er>", "</"]
    pattern = re.compile(ANSWER_TAG_PATTERN)
    for _ in range(20_000):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(14)))
        assert extract_answer(text) == _old_extract(text), text
        assert (pattern.fullmatch(text) is None) == (OLD_PATTERN.fullmatch(text) is None), text

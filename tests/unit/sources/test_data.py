"""Task sources: file validation with precise errors, splits, procedural generators."""

from __future__ import annotations

import doctest
import itertools
import json
import os
from pathlib import Path

import pytest

import streamrl.sources
import streamrl.sources.arithmetic
import streamrl.sources.base
import streamrl.sources.mixture
from streamrl.sources import (
    ArithmeticTaskSource,
    DataError,
    DatasetsTaskSource,
    JsonlTaskSource,
    ParquetTaskSource,
    build_task_source,
)
from streamrl.sources.files import prompt_key_of

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(
    "module",
    [
        streamrl.sources,
        streamrl.sources.arithmetic,
        streamrl.sources.base,
        streamrl.sources.mixture,
    ],
)
def test_doctests(module: object) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def write_jsonl(path: Path, lines: list[str | dict]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def jsonl_error(tmp_path: Path, lines: list[str | dict]) -> str:
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    with pytest.raises(DataError) as info:
        JsonlTaskSource(path)
    return str(info.value)


# ----------------------------------------------------------------------------- JSONL


def test_jsonl_bad_json_names_file_and_line(tmp_path: Path) -> None:
    good = {"prompt": "1+1=", "answer": 2}
    msg = jsonl_error(tmp_path, [good, "", '{"prompt": "2+2=", "answer": 4', good])
    assert msg.startswith(f"{tmp_path / 'train.jsonl'}:3: invalid JSON")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"answer": "4"}, ":2: missing prompt: set 'prompt' (a string) or 'messages'"),
        ({"prompt": 12}, ":2: field 'prompt': expected a string, got int"),
        ({"prompt": "  "}, ":2: field 'prompt': empty prompt"),
        (
            {"prompt": "a", "answer": [1]},
            ":2: field 'answer': expected a string or number, got list",
        ),
        ({"prompt": "a", "answer": True}, "field 'answer': expected a string or number, got bool"),
        ({"prompt": "a", "id": 1.5}, ":2: field 'id': expected a string or integer, got float"),
        (
            {"prompt": "a", "metadata": [1]},
            ":2: field 'metadata': expected an object/dict, got list",
        ),
        (
            {"prompt": "a", "messages": [{"role": "user", "content": "a"}]},
            ":2: both 'prompt' and 'messages' are set",
        ),
        ({"messages": "hi"}, ":2: field 'messages': expected a list of messages, got str"),
        ({"messages": []}, ":2: field 'messages': empty list of messages"),
        ({"messages": ["hi"]}, ":2: field 'messages': message 0: expected an object, got str"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            ":2: field 'messages': message 1: role must be one of system, user, assistant, tool",
        ),
        (
            {"messages": [{"role": "user", "content": None}]},
            ":2: field 'messages': message 0: content must be a string, got null",
        ),
        ([1, 2], ":2: expected a JSON object, got list"),
    ],
)
def test_jsonl_row_validation(tmp_path: Path, row: object, expected: str) -> None:
    line = json.dumps(row)
    msg = jsonl_error(tmp_path, [{"prompt": "ok"}, line])
    assert msg.startswith(str(tmp_path / "train.jsonl")), msg
    assert expected in msg, msg


def test_jsonl_duplicate_id(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}])
    assert ":2: field 'id': duplicate id 'a' (first at line 1)" in msg


def test_jsonl_schema(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+1=", "answer": 2, "level": 1, "metadata": {"level": 5, "src": "m"}},
            "   ",
            {"id": 7, "messages": [{"role": "user", "content": "hi"}], "answer": "Paris"},
        ],
    )
    src = JsonlTaskSource(path, heldout_fraction=0.0)
    items = sorted((next(src.train_iter(0)), next(src.train_iter(1))), key=lambda it: it.id)
    by_id = {it.id: it for it in itertools.islice(src.train_iter(0), 4)}
    assert set(by_id) == {"7", "d.jsonl:1"}
    first = by_id["d.jsonl:1"]
    assert (first.prompt, first.messages, first.answer) == ("1+1=", None, "2")
    assert first.metadata == {"level": 5, "src": "m"}  # explicit metadata wins the clash
    second = by_id["7"]
    assert second.prompt is None and second.messages == [{"role": "user", "content": "hi"}]
    assert items and src.heldout() == []


def test_configurable_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q?", "solution": 3.5}])
    src = JsonlTaskSource(path, prompt_key="question", answer_key="solution", heldout_fraction=0)
    item = next(src.train_iter(0))
    assert (item.prompt, item.answer, item.metadata) == ("q?", "3.5", {})
    with pytest.raises(DataError, match="missing prompt: set 'prompt'"):
        JsonlTaskSource(path, heldout_fraction=0)


def test_train_iter_cycles_and_is_deterministic(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    src = JsonlTaskSource(path, heldout_fraction=0)
    a = [it.id for it in itertools.islice(src.train_iter(3), 15)]
    assert a == [it.id for it in itertools.islice(src.train_iter(3), 15)]
    assert a != [it.id for it in itertools.islice(src.train_iter(4), 15)]
    for epoch in range(3):  # every epoch is a permutation of all rows
        assert sorted(a[5 * epoch : 5 * epoch + 5]) == sorted(f"d.jsonl:{i}" for i in range(1, 6))
    first = next(src.train_iter(0))
    first.metadata["x"] = 1  # items are fresh copies
    assert all("x" not in it.metadata for it in itertools.islice(src.train_iter(0), 5))


def test_heldout_fraction_split(tmp_path: Path) -> None:
    rows = [{"prompt": f"question {i}", "answer": i} for i in range(400)]
    rows.append({"prompt": "question 7", "answer": 7, "id": "dup"})  # same prompt, other id
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    src = JsonlTaskSource(path, heldout_fraction=0.2)
    held = {prompt_key_of(it) for it in src.heldout()}
    train = {prompt_key_of(it) for it in itertools.islice(src.train_iter(0), len(src))}
    assert 40 < len(held) < 120 and len(held) + len(train) == 400
    assert not held & train
    assert [it.id for it in src.heldout(5)] == [
        it.id for it in JsonlTaskSource(path, heldout_fraction=0.2).heldout(5)
    ]


def test_eval_file_split(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}"} for i in range(6)])
    evalf = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "q1"}, {"prompt": "new"}])
    src = JsonlTaskSource(train, eval_path=evalf)
    assert [it.prompt for it in src.heldout()] == ["q1", "new"]
    assert len(src) == 5 and src.num_dropped_overlap == 1
    assert len(JsonlTaskSource(evalf, heldout_fraction=1.0).heldout()) == 2  # eval-only file
    with pytest.raises(ValueError, match="either eval_path or heldout_fraction"):
        JsonlTaskSource(train, eval_path=evalf, heldout_fraction=0.1)


# ----------------------------------------------------------------------- Parquet / datasets

ROWS = [
    {"id": "a", "prompt": "1+1=", "messages": None, "answer": "2", "level": 1},
    {
        "id": "b",
        "prompt": None,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "answer": "Paris",
        "level": 2,
    },
]


def _by_id(src: object) -> dict:
    return {it.id: it for it in itertools.islice(src.train_iter(0), 4)}


def test_parquet_round_trip(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    items = _by_id(ParquetTaskSource(path, heldout_fraction=0))
    assert (items["a"].prompt, items["a"].answer, items["a"].metadata) == (
        "1+1=",
        "2",
        {"level": 1},
    )
    assert items["b"].messages == [{"role": "user", "content": "Capital of France?"}]

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x"}, {"prompt": None}]), bad)
    with pytest.raises(DataError, match=r"bad\.parquet: row 1: missing prompt"):
        ParquetTaskSource(bad)


def test_datasets_round_trip(tmp_path: Path) -> None:
    import datasets

    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_list(ROWS), test=datasets.Dataset.from_list(ROWS[:1])
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    src = DatasetsTaskSource(tmp_path / "saved", split="train", eval_split="test")
    assert [it.id for it in src.heldout()] == ["a"]
    assert set(_by_id(src)) == {"b"}  # "a" is held out, so dropped from train
    assert _by_id(src)["b"].messages == ROWS[1]["messages"]

    jsonl = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "answer": 1}, {"prompt": 5}])
    with pytest.raises(DataError, match=r"d\.jsonl: row 1: field 'prompt': expected a string"):
        build_task_source("datasets", path=str(jsonl), cache_dir=str(tmp_path / "cache"))


# ---------------------------------------------------------------------------- arithmetic


def test_arithmetic_split_disjoint_and_deterministic() -> None:
    src = ArithmeticTaskSource(digits=1, operators="+-*", heldout_size=50)
    held = src.heldout()
    held_exprs = {it.metadata["expression"] for it in held}
    assert 0 < len(held) <= 50 and len(held_exprs) == len(held)
    train = list(itertools.islice(src.train_iter(seed=1), 1000))
    assert held_exprs.isdisjoint(it.metadata["expression"] for it in train)
    assert [it.id for it in train[:20]] == [
        it.id
        for it in itertools.islice(
            ArithmeticTaskSource(digits=1, operators="+-*").train_iter(1), 20
        )
    ]
    assert [it.id for it in train[:20]] != [it.id for it in itertools.islice(src.train_iter(2), 20)]
    assert [it.id for it in ArithmeticTaskSource(digits=1, operators="+-*").heldout(5)] == [
        it.id for it in held[:5]
    ]
    for it in train[:200]:  # answers are right
        a, b = it.metadata["operands"]
        (op,) = it.metadata["operators"]
        assert it.answer == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert it.prompt == f"{a}{op}{b}="


def test_arithmetic_chat_and_options() -> None:
    src = build_task_source("arithmetic", digits=2, operators="*+", num_operands=3, format="chat")
    item = next(src.train_iter(0))
    (msg,) = item.messages
    ops, (a, b, c) = item.metadata["operators"], item.metadata["operands"]
    assert msg["role"] == "user"
    assert msg["content"] == f"What is {a} {ops[0]} {b} {ops[1]} {c}? Reply with only the number."
    assert item.answer == str(eval(item.metadata["expression"]))  # noqa: S307 - our own digits
    with pytest.raises(ValueError, match="operators"):
        ArithmeticTaskSource(operators="/")


def test_build_task_source_errors() -> None:
    with pytest.raises(ValueError, match="unknown task source kind 'csv'; known: arithmetic"):
        build_task_source("csv")
    with pytest.raises(ValueError, match="digit: unknown option; accepted: digits"):
        build_task_source("arithmetic", digit=2)
    with pytest.raises(ValueError, match=r"data\.options\.path: required option is missing"):
        build_task_source("jsonl")


# ------------------------------------------------------------------------ reasoning-gym


def test_reasoning_gym_source() -> None:
    from streamrl.rollout.rewards import reasoning_gym

    src = build_task_source("reasoning_gym", task="leg_counting", size=30, heldout_size=10)
    held = src.heldout()
    train = list(itertools.islice(src.train_iter(0), 30))
    assert len(held) == 10
    assert {it.prompt for it in held}.isdisjoint(it.prompt for it in train)
    assert [it.id for it in train] == [it.id for it in itertools.islice(src.train_iter(0), 30)]
    item = train[0]
    assert item.metadata["rg_task"] == "leg_counting"
    assert item.metadata["rg_entry"]["question"] == item.prompt
    assert reasoning_gym(item.answer, item) == 1.0
    assert reasoning_gym(f"<answer>{int(item.answer) + 1}</answer>", item) < 1.0

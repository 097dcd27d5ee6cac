"""A rubric-judged run through the CLI: a data file whose rows carry rubrics, a judge on
loopback that scores every criterion 7/10, the per-criterion scores in the step rows and
the sample metadata; a malformed rubric stops the run before it starts, naming the file,
the line and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from streamrl.cli.main import main
from tests.tiny_run import metric_rows
from tests.unit.rollout.test_arena_judges import judge_server

RUBRIC = [
    {"criterion": "the sum is right", "weight": 3, "name": "correct"},
    {"criterion": "a number only", "name": "terse"},
]


def write_rows(path: Path, rubric_of: Callable[[int], list]) -> None:
    rows = [
        {"prompt": f"{a}+{b}=", "answer": a + b, "rubric": rubric_of(k)}
        for k, (a, b) in enumerate((10 + i, 20 + 2 * i) for i in range(12))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_args(tmp_path: Path, data: Path, url: str) -> list[str]:
    judge = json.dumps(
        [
            {
                "name": "rubric_judge",
                "weight": 1.0,
                "options": {"judge": {"backend": "url", "url": url}, "unparsed": "skip"},
            },
            {"name": "numeric_match", "weight": 0.0},
        ]
    )
    return [
        *("model.name_or_path=tiny-small", "sft.steps=0", "eval.every=0"),
        *("eval.heldout_size=2", "run.progress=false", "run.tensorboard=false"),
        *("run.save_weights=false", "algorithm.dynamic_sampling=false", "train.steps=2"),
        *("train.items_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4"),
        *("data.kind=jsonl", f"data.options.path={data}", "data.options.heldout_fraction=0.2"),
        f"reward.components={judge}",
        *(f"run.output_dir={tmp_path}", "run.name=judged"),
    ]


def test_a_rubric_judged_run_logs_each_criterion(tmp_path: Path) -> None:
    data = tmp_path / "judged.jsonl"
    write_rows(data, lambda k: RUBRIC)
    with judge_server(lambda prompt: "7") as (url, seen):
        assert main(["train", *run_args(tmp_path, data, url)]) == 0
    rows = [r for r in metric_rows(tmp_path / "judged") if "reward/rubric_judge" in r]
    # steps x items x answers x criteria, and the groups rolled out ahead (eta = 1)
    assert len(rows) == 2 and len(seen) >= 2 * 2 * 2 * 2
    for r in rows:
        assert r["reward/rubric_judge"] == 0.7
        assert r["reward/rubric_judge/correct"] == r["reward/rubric_judge/terse"] == 0.7
        assert r["reward/rubric_judge/_unparsed"] == 0.0


def test_a_malformed_rubric_stops_the_run_naming_file_line_and_field(tmp_path, capsys):
    data = tmp_path / "judged.jsonl"
    write_rows(data, lambda k: RUBRIC if k != 4 else [{"criterion": "x", "weight": -2}])
    assert main(["train", *run_args(tmp_path, data, "http://127.0.0.1:9/v1")]) != 0
    err = capsys.readouterr().err
    assert f"{data}:5: field 'rubric[0].weight': expected a positive number, got -2" in err
    assert "Traceback" not in err

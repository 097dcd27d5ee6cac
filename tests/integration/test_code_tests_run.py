"""A short RL run through the CLI on the code task source with the unit_tests reward (the
tiny preset: its answers do not parse, which the run scores 0 and counts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.cli.main import main
from streamrl.rollout.rewards.unit_tests import STATUSES
from tests.sandbox_corpus import require_strong
from tests.tiny_run import metric_rows


def test_a_tiny_run_with_the_unit_tests_reward(tmp_path: Path) -> None:
    require_strong()
    args = [
        *("model.name_or_path=tiny-small", "sft.steps=0", "eval.every=0"),
        *("eval.heldout_size=3", "eval.samples=0", "run.progress=false"),
        *("run.tensorboard=false", "run.save_weights=false", "train.steps=2"),
        *("algorithm.dynamic_sampling=false", "train.items_per_step=2", "rollout.group_size=2"),
        *("rollout.max_new_tokens=8", "data.kind=code", "data.options={difficulty: 1}"),
        *("reward.components=[{name: unit_tests}]", "reward.correct_reward=unit_tests"),
        *("reward.timeout_s=30", f"run.output_dir={tmp_path}", "run.name=code"),
    ]
    assert main(["train", *args]) == 0
    run = tmp_path / "code"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = metric_rows(run)[1:]
    assert len(rows) == 2
    for row in rows:
        assert "reward/unit_tests" in row
        assert not any(k.startswith("stream/failed/") and v for k, v in row.items()), row
    # the rollout side's counts land in the row of the step that collects them (with
    # asynchronous rollouts a step may have none of its own)
    counted = [r for r in rows if "unit_tests/test_timeouts" in r]
    assert counted
    for row in counted:  # every answer counted under exactly one status
        assert sum(row.get(f"unit_tests/{s}", 0.0) for s in STATUSES) == pytest.approx(1.0)

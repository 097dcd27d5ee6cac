"""The reward-hacking monitors in real runs through the CLI: the hackable example fires and
stops (status stopped_by_monitor, run.log, console, metrics); a normal tiny run has every
monitor's statistics in its rows and none fires."""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.cli.main import main
from tests.paths import ROOT
from tests.tiny_run import metric_rows


def test_the_hackable_example_fires_and_stops(tmp_path: Path, capsys) -> None:
    example = str(ROOT / "examples" / "reward_hacking.yaml")
    assert main(["train", example, f"run.output_dir={tmp_path}", "run.progress=false"]) == 0
    run = tmp_path / "reward_hacking"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped_by_monitor"
    assert summary["stopped_by_monitor"] == "component_dominance"
    assert summary["steps"] < 10
    warning = "monitor component_dominance fired at step 1: overlong_penalty is"
    assert warning in (run / "run.log").read_text()
    assert f"streamrl: warning: {warning}" in capsys.readouterr().out
    row = metric_rows(run)[1]
    assert row["monitor_fired/component_dominance"] == 1.0
    assert row["reward/overlong_penalty"] < 0 and "reward/numeric_match" in row


def test_a_normal_tiny_run_is_quiet(tmp_path: Path, capsys) -> None:
    args = [
        *("model.name_or_path=tiny-small", "sft.steps=0", "eval.every=0"),
        *("eval.heldout_size=4", "run.progress=false", "run.tensorboard=false"),
        *("run.save_weights=false", "algorithm.dynamic_sampling=false", "train.steps=6"),
        *("train.items_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6"),
        *("monitors.window=2", f"run.output_dir={tmp_path}", "run.name=normal"),
    ]
    assert main(["train", *args]) == 0
    run = tmp_path / "normal"
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    rows = metric_rows(run)[1:]
    for name in ("length_drift", "length_jump", "entropy_collapse"):
        assert any(f"monitor/{name}" in r for r in rows), name
    assert not any(v for r in rows for k, v in r.items() if k.startswith("monitor_fired/"))
    assert "monitor" not in (run / "run.log").read_text()
    assert "streamrl: warning: monitor" not in capsys.readouterr().out

"""`streamrl sweep`: seeds in sequence and in parallel, failures, and `compare` grouping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.analysis.compare import group_runs
from streamrl.analysis.runs import load_run
from streamrl.cli.main import main
from streamrl.run.sweep import plan_sweep

# 2 RL steps of 2 items per seed
TWO_STEPS = [
    "train.steps=2",
    "train.items_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "algorithm.dynamic_sampling=false",  # an untrained model rarely varies within a group
]


def check_runs(out: Path, seeds: list[int], stdout: str) -> None:
    dirs = [out / f"sweep-s{s}" for s in seeds]
    for d in dirs:
        assert (d / "summary.json").is_file(), d
        assert str(d) in stdout
    assert [json.loads((d / "summary.json").read_text()) for d in dirs]
    runs = [load_run(d) for d in dirs]
    assert [r.seed for r in runs] == seeds
    groups = group_runs(runs)
    assert len(groups) == 1 and len(next(iter(groups.values()))) == len(seeds)
    assert "streamrl compare " + " ".join(str(d) for d in dirs) in stdout


@pytest.mark.parametrize("parallel", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_sweep_runs_each_seed_into_one_recipe(
    tmp_path: Path, tiny_config, capsys, parallel: int
) -> None:
    out = tmp_path / "runs"
    args = ["sweep", "--seeds", "0", "1", *tiny_config.args(*TWO_STEPS, output_dir=out)]
    assert main([*args, "--parallel", str(parallel)]) == 0
    check_runs(out, [0, 1], capsys.readouterr().out)


def test_failing_seed_is_reported_and_others_still_run(
    tmp_path, tiny_config, capsys, monkeypatch
) -> None:
    import streamrl.run.launch

    real_train = streamrl.run.launch.train

    def flaky_train(cfg, progress=None):
        if cfg.seed == 0:
            raise RuntimeError("seed 0 exploded")
        return real_train(cfg, progress)

    monkeypatch.setattr(streamrl.run.launch, "train", flaky_train)
    out = tmp_path / "runs"
    assert main(["sweep", "--seeds", "0", "1", *tiny_config.args(*TWO_STEPS, output_dir=out)]) == 1
    captured = capsys.readouterr()
    assert "seed 0: FAILED (RuntimeError: seed 0 exploded)" in captured.out
    assert "1 of 2 seeds failed: [0]" in captured.err
    check_runs(out, [1], captured.out)


def test_plan_names_runs_and_output_dir(tmp_path: Path) -> None:
    config = tmp_path / "my_recipe.yaml"
    config.write_text("train:\n  steps: 3\n")
    _, name, out = plan_sweep(str(config), [], [0, 1])
    assert (name, out) == ("my_recipe", str(Path("runs") / "my_recipe"))
    _, name, out = plan_sweep(str(config), ["run.name=x", "run.output_dir=elsewhere"], [0])
    assert (name, out) == ("x", "elsewhere")
    with pytest.raises(ValueError, match="duplicates"):
        plan_sweep(str(config), [], [1, 1])


def test_bad_seed_word_is_a_usage_error(capsys) -> None:
    assert main(["sweep", "--seeds", "0", "one"]) == 2
    assert "not an integer seed" in capsys.readouterr().err

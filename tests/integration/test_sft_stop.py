"""SFT that ends at a held-out accuracy threshold (``sft.eval_every``,
``sft.stop_at_eval``): it stops at the first evaluation that reaches it, goes on to RL,
and a resume from its checkpoint does not train SFT again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.cli.main import main
from streamrl.run.checkpoint import latest_checkpoint
from tests.paths import ROOT
from tests.tiny_run import tiny_args

ROOT = ROOT


def _args(out: Path, name: str, *extra: str) -> list[str]:
    """SFT with an evaluation every 5 steps, then 2 RL steps; the final weights saved."""
    return tiny_args(
        out,
        "sft.steps=60",
        "sft.examples_per_step=8",
        "sft.eval_every=5",
        "data.options={digits: 1, operators: '+', heldout_size: 8}",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "train.items_per_step=4",
        "train.steps=2",
        "stream.max_staleness=0",
        "algorithm.dynamic_sampling=false",
        "eval.heldout_size=8",
        "eval.samples=2",
        "run.checkpoint_every=0",
        "run.save_weights=true",
        "runtime.threads=1",
        f"run.name={name}",
        *extra,
    )


def _sft_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "sft_metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_sft_evaluates_every_n_steps_and_runs_to_the_end_below_the_threshold(
    tmp_path: Path,
) -> None:
    assert main(["train", *_args(tmp_path, "run", "sft.steps=12", "sft.stop_at_eval=1.01")]) == 0
    run_dir = tmp_path / "run"
    rows = _sft_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(12))
    evaluated = [r["step"] for r in rows if "eval/accuracy" in r]
    assert evaluated == [4, 9]  # after steps 5 and 10
    assert all("eval/sampled_accuracy" not in r for r in rows)  # greedy only inside SFT
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sft_steps_done"] == 12
    assert 0 <= summary["eval_sampled_accuracy_before"] <= 1


@pytest.mark.slow
def test_sft_stops_at_the_threshold_and_a_resume_does_not_train_it_again(tmp_path: Path) -> None:
    # a threshold of 0 is reached by the first evaluation, after step 5 of 60
    assert main(["train", *_args(tmp_path, "run", "sft.stop_at_eval=0.0")]) == 0
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["sft_steps_done"] == 5
    assert [r["step"] for r in _sft_rows(run_dir)] == list(range(5))
    assert summary["steps"] == 2  # and RL ran after it
    assert latest_checkpoint(run_dir).name == "done-000002"  # the final state
    assert (run_dir / "checkpoints" / "sft-000005").is_dir()
    final = load_file(str(run_dir / "model" / "model.safetensors"))

    # a kill right after SFT: only its checkpoint is left. The resume finds SFT done, so
    # only the 2 RL steps run again (eta = 0: the same weights); continuing SFT would have
    # trained 55 more steps
    shutil.copytree(run_dir, tmp_path / "copy")
    for later in (tmp_path / "copy" / "checkpoints").glob("[dr]*-*"):
        shutil.rmtree(later)
    (tmp_path / "copy" / "checkpoints" / "latest").unlink(missing_ok=True)
    (tmp_path / "copy" / "summary.json").unlink()
    assert latest_checkpoint(tmp_path / "copy").name == "sft-000005"
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(tmp_path / "copy")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    again = load_file(str(tmp_path / "copy" / "model" / "model.safetensors"))
    assert all(torch.equal(final[k], again[k]) for k in final)
    assert [r["step"] for r in _sft_rows(tmp_path / "copy")] == list(range(5))


def test_rl_ends_when_its_wall_clock_budget_is_spent(tmp_path: Path) -> None:
    """``run.max_rl_seconds``: the step that spends the budget is the last; the final
    evaluation still runs and the summary says at which step RL stopped."""
    budget = ["sft.steps=0", "train.steps=40", "run.max_rl_seconds=1e-6", "run.save_weights=false"]
    assert main(["train", *_args(tmp_path, "run", *budget)]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps"] == summary["stopped_early_at_step"] == 1
    assert summary["rl_time_s"] > 0
    assert 0 <= summary["eval_accuracy_after"] <= 1
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "eval/accuracy" in rows[-1]


def test_rl_ends_at_the_first_evaluation_that_reaches_stop_at_eval(tmp_path: Path) -> None:
    """``run.stop_at_eval`` ends RL through the same exit as the wall-clock budget."""
    stop = ["sft.steps=0", "train.steps=40", "eval.every=1", "run.stop_at_eval=0.0"]
    assert main(["train", *_args(tmp_path, "run", *stop, "run.save_weights=false")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps"] == summary["stopped_early_at_step"] == 1

"""runtime.backend=ray: a trainer actor that dies is restarted from the latest
checkpoint, up to runtime.max_trainer_restarts, then the run fails naming the cause."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from streamrl.run.checkpoint import latest_checkpoint
from streamrl.run.launch import TrainerFailed, train
from tests.paths import ROOT

pytestmark = pytest.mark.slow


# 30 steps of 4 items on the Ray backend, a checkpoint every 2: the kill lands mid-run
RUN = [
    "data.options={digits: 1, operators: '+', heldout_size: 8}",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "rollout.ignore_eos=true",
    "algorithm.dynamic_sampling=false",
    "train.items_per_step=4",
    "train.steps=30",
    "run.checkpoint_every=2",
    "run.name=ray",
    "runtime.backend=ray",
]


def _kill_trainer_after_a_checkpoint(run_dir: Path) -> threading.Thread:
    def kill() -> None:
        deadline = time.monotonic() + 300
        while latest_checkpoint(run_dir) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int((run_dir / "trainer.pid").read_text()), signal.SIGKILL)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_a_killed_trainer_actor_resumes_from_its_checkpoint(tmp_path: Path, tiny_config) -> None:
    pytest.importorskip("ray")
    killer = _kill_trainer_after_a_checkpoint(tmp_path / "ray")
    result = train(tiny_config(*RUN))
    killer.join(5)
    assert result.summary["trainer_restarts"] == 1
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["stream/consumed"] == 30 * 4
    rows = [json.loads(x) for x in (tmp_path / "ray" / "ledger.jsonl").read_text().splitlines()]
    consumed = [i for r in rows for i in r["consumed"]]
    assert len(consumed) == len(set(consumed)) == 120  # nothing lost or consumed twice


def test_trainer_restarts_are_bounded_and_the_error_names_the_cause(
    tmp_path: Path, tiny_config
) -> None:
    pytest.importorskip("ray")
    killer = _kill_trainer_after_a_checkpoint(tmp_path / "ray")
    with pytest.raises(TrainerFailed, match=r"died 1 times \(runtime.max_trainer_restarts=0\)"):
        train(tiny_config(*RUN, "runtime.max_trainer_restarts=0"))
    killer.join(5)


def test_progress_reaches_the_console_from_the_ray_trainer(tmp_path: Path) -> None:
    """The trainer actor prints its SFT and RL progress; Ray forwards it to the driver."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    root = ROOT
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli.main",
            "train",
            "model.name_or_path=tiny-small",
            "sft.steps=10",
            "train.steps=2",
            "train.items_per_step=2",
            "rollout.group_size=2",
            # an untrained model's groups are all wrong: dynamic sampling would keep drawing
            "algorithm.dynamic_sampling=false",
            "data.options={digits: 1, operators: '+', heldout_size: 8}",
            "eval.heldout_size=4",
            "eval.samples=1",
            "runtime.backend=ray",
            "run.tensorboard=false",
            f"run.output_dir={tmp_path}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "[sft] step 10/10" in out and "[rl] step 2/2" in out, out[-3000:]

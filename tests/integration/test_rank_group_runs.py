"""Whole runs with a 2-rank trainer group (train.world_size=2) through the CLI: a rank
that is SIGKILLed or hangs (SIGSTOP) mid-run, rank 0 (the controller, in the
supervisor's child) included, makes the group restart from the latest checkpoint, in the
same run, with every item consumed once and, at eta = 0, the weights of the
uninterrupted 2-rank run, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.test_resume import _args, _check_books, _latest_step
from tests.paths import ROOT

STEPS = 8
GROUP = ("stream.max_staleness=0", f"train.steps={STEPS}", "train.world_size=2")


def _train(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _rank_after_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int, rank: int = 1) -> int:
    """The pid of ``rank`` once checkpoint ``step`` is written."""
    deadline = time.monotonic() + 300
    while _latest_step(run_dir) < step:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    ranks = _pids(run_dir)
    assert int(ranks["0"]) != proc.pid  # rank 0 runs in the supervisor's child
    return int(ranks[str(rank)])


def _pids(run_dir: Path) -> dict[str, str]:
    return dict(line.split() for line in (run_dir / "ranks.pid").read_text().splitlines())


def _alive(pid: int) -> bool:
    """Running (a zombie that no one has reaped yet is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full")
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", *_args(out, "full", *GROUP)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    return out / "full"


CAUSES = {
    (0, "SIGKILL"): "was killed by SIGKILL",  # the supervisor sees its child die
    (1, "SIGKILL"): "rank 1 exited with -9",  # rank 0's collective fails at once
    (0, "SIGSTOP"): "answered no ping for 30s",  # the supervisor's ping
    (1, "SIGSTOP"): "timed out",  # rank 0's collective times out
}
# rank 1 SIGKILLed: rank 0's failed collective, also met by a hung rank 1; and the
# teardown and resume, also met by a killed rank 0
SOAK = pytest.mark.soak


@pytest.mark.parametrize(
    ("rank", "fault"),
    [
        (0, "SIGKILL"),
        (1, "SIGSTOP"),
        pytest.param(1, "SIGKILL", marks=SOAK),
        pytest.param(0, "SIGSTOP", marks=SOAK),
    ],
)
def test_a_dead_or_hung_rank_restarts_the_group_from_the_checkpoint_exactly(
    tmp_path: Path, uninterrupted: Path, rank: int, fault: str
) -> None:
    # SIGSTOP: the rank hangs; rank 0's next collective (rank 1 hung) or the supervisor's
    # ping (rank 0 hung) times out after 30 s
    proc = _train(*_args(tmp_path, "run", *GROUP, "train.collective_timeout_s=30"))
    run_dir = tmp_path / "run"
    victim = _rank_after_checkpoint(proc, run_dir, 2, rank)
    followers = {int(p) for r, p in _pids(run_dir).items() if r != "0"}
    os.kill(victim, getattr(signal, fault))
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert "rank group failed" in err and "(1/2)" in err
    assert not [p for p in followers if _alive(p)]  # the first group left no rank behind
    cause = CAUSES[rank, fault]
    log = (run_dir / "run.log").read_text()
    assert "rank group was restarted from the latest checkpoint (1 so far)" in log
    assert cause in log.lower() or cause in log
    summary = _check_books(run_dir, STEPS, 4, eta=0)  # every item consumed exactly once
    assert summary["train/group_restarts"] == 1
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/group_restarts"] == 1
    a, b = _weights(uninterrupted), _weights(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_killed_two_rank_run_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """The whole process tree (the supervisor, rank 0 and its followers) SIGKILLed, then
    --resume."""
    proc = _train(*_args(tmp_path, "run", *GROUP))
    run_dir = tmp_path / "run"
    follower = _rank_after_checkpoint(proc, run_dir, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    resumed = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert not Path(f"/proc/{follower}").exists()  # the killed run left no rank behind
    summary = _check_books(run_dir, STEPS, 4, eta=0)
    assert summary["train/group_restarts"] == 0  # a resume, not a group restart
    a, b = _weights(uninterrupted), _weights(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.soak  # the stop's forwarding is a unit test (tests/unit/run/test_supervisor.py)
def test_ctrl_c_to_the_process_group_stops_a_two_rank_run_once(tmp_path: Path) -> None:
    """A Ctrl-C reaches the supervisor, rank 0 and rank 1: the run stops once, gracefully
    (a checkpoint, exit code 130, no rank left), and a resume completes it."""
    proc = _train(*_args(tmp_path, "run", *GROUP))
    run_dir = tmp_path / "run"
    _rank_after_checkpoint(proc, run_dir, 2)
    ranks = _pids(run_dir).values()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert err.count("SIGINT received") == 1 and "Traceback" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert not [p for p in ranks if _alive(int(p))]
    resumed = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr
    _check_books(run_dir, STEPS, 4, eta=0)

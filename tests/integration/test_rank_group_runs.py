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

from tests.integration.test_resume import _args, _check_books, _latest_step, _resume
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


def _restarted_ranks(proc: subprocess.Popen, run_dir: Path, after: int, old: dict) -> dict:
    """``ranks.pid`` of the group that replaced ``old``, once it wrote a checkpoint after
    step ``after``."""
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"no checkpoint after step {after} appeared"
        if _latest_step(run_dir) > after:
            ranks = _pids(run_dir)
            if not set(ranks.values()) & set(old.values()):
                return ranks
        time.sleep(0.05)


def _same_run(run_dir: Path, uninterrupted: Path, err: str, causes: list[str]) -> None:
    """The run ended well after one restart per cause: every item consumed once and the
    uninterrupted run's weights, bit for bit."""
    n = len(causes)
    assert "rank group failed" in err and f"({n}/2)" in err, err
    log = (run_dir / "run.log").read_text()
    assert f"rank group was restarted from the latest checkpoint ({n} so far)" in log
    assert all(cause in log.lower() or cause in log for cause in causes), log
    summary = _check_books(run_dir, STEPS, 4, eta=0)  # every item consumed exactly once
    assert summary["train/group_restarts"] == n
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/group_restarts"] == n
    a, b = _weights(uninterrupted), _weights(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


CAUSES = {
    (0, "SIGKILL"): "was killed by SIGKILL",  # the supervisor sees its child die
    (1, "SIGKILL"): "rank 1 exited with -9",  # rank 0's collective fails at once
    (0, "SIGSTOP"): "answered no ping for 30s",  # the supervisor's ping
    (1, "SIGSTOP"): "timed out",  # rank 0's collective times out
}


def test_a_killed_rank_0_then_a_hung_rank_1_each_restart_the_group_exactly(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """The suite's case: one run, two faults. Rank 0 (the supervisor's child) is
    SIGKILLed: the supervisor restarts the group; then rank 1 hangs (SIGSTOP): rank 0's
    next collective times out after 30 s and the group restarts again. Each single fault,
    on each rank, is a `soak` case below."""
    proc = _train(*_args(tmp_path, "run", *GROUP, "train.collective_timeout_s=30"))
    run_dir = tmp_path / "run"
    os.kill(_rank_after_checkpoint(proc, run_dir, 2, 0), signal.SIGKILL)
    first = _pids(run_dir)
    second = _restarted_ranks(proc, run_dir, _latest_step(run_dir), first)
    os.kill(int(second["1"]), signal.SIGSTOP)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    left = {*first.values(), *second.values()} - {first["0"]}  # rank 0: reaped or a zombie
    assert not [p for p in left if _alive(int(p))], "a rank outlived its group"
    _same_run(run_dir, uninterrupted, err, [CAUSES[0, "SIGKILL"], CAUSES[1, "SIGSTOP"]])


@pytest.mark.soak
@pytest.mark.parametrize("rank, fault", list(CAUSES))
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
    assert not [p for p in followers if _alive(p)]  # the first group left no rank behind
    _same_run(run_dir, uninterrupted, err, [CAUSES[rank, fault]])


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
    _resume(run_dir)
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
    _resume(run_dir)
    _check_books(run_dir, STEPS, 4, eta=0)

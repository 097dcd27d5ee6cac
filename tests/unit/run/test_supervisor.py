"""The local placement's supervisor (no model: tiny fake rank-0 functions in spawned
children): a child's result comes back, its exception is re-raised unchanged, a child
killed, exited without a result or hung is restarted with resume and its cause counted,
and past ``runtime.max_trainer_restarts`` the run fails naming the last cause."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.config import ConfigError
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.supervisor import TrainerFailed, supervise


class GroupDown(RuntimeError):
    """Stands for the child's report that a follower failed (RankGroupFailed)."""


class TwoPartError(ValueError):
    """A user's error whose constructor does not take its message back."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")


def answer(how: str, resume: bool, restarts: list[str], *, stop, progress):
    """A fake rank 0: fails as ``how`` says on its first attempt, returns on a resume."""
    if resume:
        return ("done", restarts)
    if how == "return":
        if progress is not None:
            progress("rl", 1, 2, {"reward": 0.5})
        return ("done", restarts)
    if how == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        os._exit(3)
    if how == "SIGSTOP":
        os.kill(os.getpid(), signal.SIGSTOP)
    if how == "group":
        raise GroupDown("rank 1 exited with -9")
    if how == "config":
        raise ConfigError("run.yaml:3: train.lr: must be positive")
    if how == "two-part":
        raise TwoPartError("rows[2].answer", "missing")
    if how == "stop":
        deadline = time.monotonic() + 30
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        raise Interrupted("run interrupted", stop.signum)
    if how == "follower":  # a follower that does not exit with its parent, then rank 0 dies
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        Path(restarts_dir(), "ranks.pid").write_text(f"0 {os.getpid()}\n1 {sleeper.pid}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError(how)


def restarts_dir() -> str:
    return os.environ["SUPERVISOR_TEST_DIR"]


def run(tmp_path: Path, how: str, limit: int = 2, stop: GracefulStop | None = None, **kw):
    restarts: list[str] = []
    value = supervise(
        answer,
        (how,),
        resume=False,
        restarts=restarts,
        limit=limit,
        run_dir=tmp_path,
        stop=stop or GracefulStop(),
        progress=kw.get("progress"),
        timeout_s=kw.get("timeout_s", 30.0),
        retry=(GroupDown,),
    )
    return value, restarts


def test_the_childs_result_and_progress_come_back(tmp_path: Path) -> None:
    seen: list[tuple] = []
    value, restarts = run(tmp_path, "return", progress=lambda *a: seen.append(a))
    assert value == ("done", []) and restarts == []
    assert seen == [("rl", 1, 2, {"reward": 0.5})]


def test_the_childs_exception_is_reraised_unchanged(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        run(tmp_path, "config")
    assert str(e.value) == "run.yaml:3: train.lr: must be positive"  # one line, as in-process
    assert "raised in rank 0's process" in e.value.__notes__[0]  # the child's traceback
    with pytest.raises(ValueError) as e:  # cannot be rebuilt: its base class, same message
        run(tmp_path, "two-part")
    assert str(e.value) == "rows[2].answer: missing"


def test_a_stop_reaches_the_child_which_ends_interrupted(tmp_path: Path) -> None:
    stop = GracefulStop()
    stop.request(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        run(tmp_path, "stop", stop=stop)
    assert e.value.exit_code == 128 + signal.SIGTERM and str(e.value) == "run interrupted"


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("SIGKILL", r"rank 0 \(pid \d+\) was killed by SIGKILL"),
        ("exit", r"rank 0 \(pid \d+\) exited with code 3 without a result"),
        ("group", r"rank 1 exited with -9"),  # the child's own report: a follower failed
        ("SIGSTOP", r"rank 0 \(pid \d+\) answered no ping for 2s .*: hung"),  # hung
    ],
    ids=["SIGKILL", "exit", "group", "SIGSTOP"],
)
def test_a_lost_child_is_restarted_with_resume_and_counted(
    tmp_path: Path, capsys, how: str, cause: str
) -> None:
    value, restarts = run(tmp_path, how, timeout_s=2.0)
    assert len(restarts) == 1 and re.fullmatch(cause, restarts[0]), restarts
    assert value == ("done", restarts)  # the new child resumed and was told the causes
    assert "(1/2)" in capsys.readouterr().err


def test_past_the_limit_the_run_fails_naming_the_cause(tmp_path: Path) -> None:
    with pytest.raises(TrainerFailed, match=r"failed 1 times .*=0\); last cause: rank 0 \(pid"):
        run(tmp_path, "SIGKILL", limit=0)


def test_a_lost_childs_followers_are_killed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SUPERVISOR_TEST_DIR", str(tmp_path))
    value, restarts = run(tmp_path, "follower")
    assert "killed by SIGKILL" in restarts[0] and value == ("done", restarts)
    follower = int((tmp_path / "ranks.pid").read_text().split()[-1])
    stat = Path(f"/proc/{follower}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone (or a zombie)

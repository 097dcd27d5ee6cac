"""The trainer's rank group on this machine, with a trivial rank program (an all_reduce
per command): spawn, rendezvous, teardown, and how a dead or hung rank surfaces on rank 0
(a failed collective within the timeout, never a silent hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from streamrl.engines.train.group import GroupSpec, LocalGroup, RankGroupFailed
from streamrl.engines.train.group.rendezvous import command_group
from streamrl.run.ranks import collective_failure
from tests.rank_programs import Unloadable, add_ranks


def step(commands) -> torch.Tensor:
    dist.broadcast_object_list(["step"], src=0, group=commands)
    t = torch.full((2,), 1.0)
    dist.all_reduce(t)
    return t


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"


def test_spawn_rendezvous_collectives_and_teardown_twice():
    spec = GroupSpec(world_size=2, collective_timeout_s=30)
    for _ in range(2):  # a closed group leaves nothing behind: a new one starts here
        group = LocalGroup(spec, add_ranks).start()
        assert dist.get_world_size() == 2 and dist.get_rank() == 0
        commands = command_group(spec)
        assert step(commands).tolist() == [3.0, 3.0]  # 1 + 2
        assert step(commands).tolist() == [3.0, 3.0]
        assert group.failure() is None
        dist.broadcast_object_list([None], src=0, group=commands)
        pids = group.pids()
        group.close()
        assert not dist.is_initialized()
        assert sorted(pids) == [1] and not alive(pids[1])
        assert group.failure() == "rank 1 exited with 0"


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_hung_rank_fails_rank_zeros_collective(fault):
    """SIGKILL: the next collective fails at once (closed connection); SIGSTOP (a hang):
    it fails after collective_timeout_s. Either way the error says the group failed."""
    spec = GroupSpec(world_size=2, collective_timeout_s=3)
    group = LocalGroup(spec, add_ranks).start()
    commands = command_group(spec)
    try:
        assert step(commands).tolist() == [3.0, 3.0]
        pid = group.pids()[1]
        os.kill(pid, getattr(signal, fault))
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            for _ in range(3):
                step(commands)
        waited = time.monotonic() - t0
        why = collective_failure(caught.value, group.failure(wait_s=1.0))
        assert why is not None
        if fault == "SIGKILL":
            assert why == "rank 1 exited with -9"
        else:
            assert group.failure(wait_s=1.0) is None and "timed out" in why.lower()
            assert waited >= 2.5  # the timeout, not an instant error
    finally:
        group.close(grace_s=0)
    assert not alive(pid) and not dist.is_initialized()
    assert collective_failure(ValueError("the run's own bug"), None) is None


def test_a_rank_that_dies_before_it_joins_fails_the_start_at_once():
    spec = GroupSpec(world_size=2, collective_timeout_s=600)
    group = LocalGroup(spec, add_ranks, (Unloadable(),))
    with pytest.raises(RankGroupFailed, match="did not assemble: rank 1 exited with 1"):
        group.start()
    assert not dist.is_initialized()


PARENT = """
import sys, time
from streamrl.engines.train.group import GroupSpec, LocalGroup
from tests.rank_programs import add_ranks
group = LocalGroup(GroupSpec(world_size=2, collective_timeout_s=30), add_ranks).start()
print(group.pids()[1], flush=True)
time.sleep(600)
"""


def test_followers_leave_when_rank_zero_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        follower = int(parent.stdout.readline())
        assert alive(follower)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(follower) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(follower)
    finally:
        parent.kill()


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_a_policy_run_with_several_ranks_is_refused_in_one_line(model):
    from streamrl.config import load_config
    from streamrl.run.preflight import PreflightError, check_world_size

    check_world_size(load_config(None, ["train.world_size=2"]))  # a language model: fine
    cfg = load_config(None, ["data.kind=gym", f"model.name_or_path={model}", "train.world_size=2"])
    with pytest.raises(PreflightError, match=r"^command-line override: train.world_size=2 shards"):
        check_world_size(cfg)
    compiled = load_config(None, ["train.world_size=2", "train.compile=true"])
    with pytest.raises(PreflightError, match=r"train.compile is not supported by the sharded"):
        check_world_size(compiled)
    on_ray = load_config(None, ["train.world_size=2", "runtime.backend=ray"])
    with pytest.raises(PreflightError, match=r"ranks are Ray actors too: set train.placement=ray"):
        check_world_size(on_ray)


def test_restarts_are_counted_and_bounded(tmp_path, capsys):
    from streamrl.run.supervisor import TrainerFailed, restart

    restarts: list[str] = []
    restart(2, restarts, tmp_path, "rank 1 exited with -9")
    restart(2, restarts, tmp_path, "RuntimeError: Timed out")
    assert restarts == ["rank 1 exited with -9", "RuntimeError: Timed out"]
    assert "(2/2)" in capsys.readouterr().err
    with pytest.raises(TrainerFailed, match=r"failed 3 times .*last cause: rank 1 exited"):
        restart(2, restarts, tmp_path, "rank 1 exited with 1")

"""train.placement=ray on a real 2-node Ray cluster simulated on this machine (loopback):
the two ranks are actors on different nodes (STRICT_SPREAD), the run goes through the CLI,
and a rank that is SIGKILLed or hangs (SIGSTOP), rank 1 or rank 0 (the controller), makes
the group restart from the checkpoint with every item consumed once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_resume import _args, _check_books, _latest_step
from tests.paths import ROOT

STEPS = 6


@pytest.fixture
def two_nodes(monkeypatch):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # every node, and the run joining them, on 127.0.0.1 (Ray otherwise swaps a loopback
    # address for the machine's own)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


# how each fault may be told (None: any way; a killed rank's actor dies, and its peer's
# collective fails at once too): a hung rank 1 times rank 0's next collective out or
# leaves its ping unanswered; a hung rank 0 (the controller, which publishes the weights)
# leaves its ping unanswered (between two commands it fails no collective) or times rank
# 1's collective out
FAULTS = {
    (1, "SIGKILL"): None,
    (1, "SIGSTOP"): ("timed out", "answered no ping"),
    (0, "SIGKILL"): None,
    (0, "SIGSTOP"): ("answered no ping", "rank 1 failed"),
}


def _start(tmp_path: Path, cluster, timeout_s: int, steps: int) -> subprocess.Popen:
    """The 2-rank run through the CLI, one rank per node of ``cluster``."""
    args = _args(
        tmp_path,
        "ray",
        "stream.max_staleness=0",
        f"train.steps={steps}",
        "train.world_size=2",
        "train.placement=ray",
        "train.ray_strategy=STRICT_SPREAD",
        f"train.collective_timeout_s={timeout_s}",
        f"runtime.ray_address={cluster.address}",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _ranks_once_past(proc: subprocess.Popen, run_dir: Path, step: int, old: list) -> dict:
    """``ranks.json`` once a checkpoint after ``step`` exists and the ranks are not the
    pids ``old`` (a restarted group's), with its two ranks on different nodes."""
    deadline = time.monotonic() + 400
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"no checkpoint after step {step} appeared"
        if _latest_step(run_dir) > step and (run_dir / "ranks.json").exists():
            where = json.loads((run_dir / "ranks.json").read_text())
            if not set(where["pids"]) & set(old):
                break
        time.sleep(0.1)
    assert where["address"] == "127.0.0.1"
    assert len(set(where["nodes"])) == 2  # rank 0 and rank 1 on different nodes
    return where


def _finished(proc: subprocess.Popen, run_dir: Path, steps: int, restarts: int) -> str:
    """The run's stderr once it ended well, with its books exact and ``restarts`` counted."""
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert "rank group failed" in err and f"({restarts}/2)" in err
    summary = _check_books(run_dir, steps, 4, eta=0)  # every item consumed exactly once
    assert summary["train/group_restarts"] == restarts
    return err


@pytest.mark.slow
def test_a_dead_rank_1_then_a_hung_rank_0_each_restart_the_group_once(
    tmp_path: Path, two_nodes
) -> None:
    """The suite's case: one run, two faults, one per mechanism. Rank 1's actor dies
    (SIGKILL), the group restarts; then rank 0 (the controller) hangs (SIGSTOP) and is
    found by the ping it leaves unanswered; the group restarts again, the hung actor killed
    with it. Each single fault, on each rank, is a `soak` case below."""
    run_dir, steps = tmp_path / "ray", 8
    proc = _start(tmp_path, two_nodes, 30, steps)
    first = _ranks_once_past(proc, run_dir, 1, [])
    os.kill(first["pids"][1], signal.SIGKILL)
    second = _ranks_once_past(proc, run_dir, _latest_step(run_dir) + 1, first["pids"])
    os.kill(second["pids"][0], signal.SIGSTOP)
    err = _finished(proc, run_dir, steps, restarts=2)
    assert "answered no ping" in err.lower() or "rank 1 failed" in err.lower(), err
    again = json.loads((run_dir / "ranks.json").read_text())
    assert len(set(again["nodes"])) == 2 and not set(again["pids"]) & set(second["pids"])
    assert _gone(second["pids"][0]), "the hung rank 0 outlived its group"


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize(("rank", "fault"), list(FAULTS), ids=lambda x: str(x))
def test_ranks_on_two_nodes_survive_a_dead_or_hung_rank(
    tmp_path: Path, two_nodes, rank: int, fault: str
) -> None:
    run_dir = tmp_path / "ray"
    proc = _start(tmp_path, two_nodes, 60 if fault == "SIGKILL" else 30, STEPS)
    where = _ranks_once_past(proc, run_dir, 1, [])
    victim = where["pids"][rank]
    os.kill(victim, getattr(signal, fault))
    err = _finished(proc, run_dir, STEPS, restarts=1)
    causes = FAULTS[rank, fault]
    assert causes is None or any(cause in err.lower() for cause in causes), err
    again = json.loads((run_dir / "ranks.json").read_text())
    assert len(set(again["nodes"])) == 2 and victim not in again["pids"]
    if fault == "SIGSTOP":  # the hung rank was killed with its group, not left behind
        assert _gone(victim), f"the hung rank {victim} outlived its group"


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie left to its parent counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.slow
def test_an_unset_ray_address_starts_its_own_instance_beside_a_cluster(two_nodes) -> None:
    """runtime.ray_address unset: a fresh local instance (one node), never the cluster
    another run started on this machine (Ray's own default would join the latest one)."""
    code = (
        "import ray; from streamrl.stream.backends.ray_actors import init_ray; "
        "init_ray(None); print(len(ray.nodes()), ray.get_runtime_context().gcs_address)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    nodes, address = out.stdout.split()[-2:]
    assert nodes == "1" and address != two_nodes.address

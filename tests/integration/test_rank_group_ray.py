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


# the suite runs one fault per mechanism: an actor that dies (rank 1 SIGKILL) and a rank
# that answers no ping (rank 0 SIGSTOP); the other two take the same paths (a dead actor;
# a collective's timeout, as on the local placement) and run with `pytest -m soak`
SOAK = {(1, "SIGSTOP"), (0, "SIGKILL")}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rank", "fault"),
    [pytest.param(*f, marks=[pytest.mark.soak] if f in SOAK else []) for f in FAULTS],
    ids=lambda x: str(x),
)
def test_ranks_on_two_nodes_survive_a_dead_or_hung_rank(
    tmp_path: Path, two_nodes, rank: int, fault: str
) -> None:
    run_dir = tmp_path / "ray"
    timeout_s = 60 if fault == "SIGKILL" else 30
    args = _args(
        tmp_path,
        "ray",
        "stream.max_staleness=0",
        f"train.steps={STEPS}",
        "train.world_size=2",
        "train.placement=ray",
        "train.ray_strategy=STRICT_SPREAD",
        f"train.collective_timeout_s={timeout_s}",
        f"runtime.ray_address={two_nodes.address}",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    while _latest_step(run_dir) < 2:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    where = json.loads((run_dir / "ranks.json").read_text())
    assert where["address"] == "127.0.0.1"
    assert len(set(where["nodes"])) == 2  # rank 0 and rank 1 on different nodes
    victim = where["pids"][rank]
    os.kill(victim, getattr(signal, fault))
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert "rank group failed" in err and "(1/2)" in err
    causes = FAULTS[rank, fault]
    assert causes is None or any(cause in err.lower() for cause in causes), err
    summary = _check_books(run_dir, STEPS, 4, eta=0)  # every item consumed exactly once
    assert summary["train/group_restarts"] == 1
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

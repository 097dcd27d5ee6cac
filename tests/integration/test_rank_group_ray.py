"""train.placement=ray on a real 2-node Ray cluster simulated on this machine (loopback):
the two ranks are actors on different nodes (STRICT_SPREAD), the run goes through the CLI,
and a SIGKILLed rank 1 makes the group restart from the checkpoint with every item
consumed once."""

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


def test_ranks_on_two_nodes_survive_a_killed_rank(tmp_path: Path, two_nodes) -> None:
    run_dir = tmp_path / "ray"
    args = _args(
        tmp_path,
        "ray",
        "stream.max_staleness=0",
        f"train.steps={STEPS}",
        "train.world_size=2",
        "train.placement=ray",
        "train.ray_strategy=STRICT_SPREAD",
        "train.collective_timeout_s=60",
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
    os.kill(where["pids"][1], signal.SIGKILL)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert "rank group failed" in err
    summary = _check_books(run_dir, STEPS, 4, eta=0)  # every item consumed exactly once
    assert summary["train/group_restarts"] == 1
    assert len(set(json.loads((run_dir / "ranks.json").read_text())["nodes"])) == 2

"""Placement: which cores and threads the trainer and each rollout worker get."""

from __future__ import annotations

import logging

import pytest

from streamrl.config import load_config
from streamrl.stream.backends import plan_placement


def _plan(*overrides: str, cpus=(0, 1, 2, 3)):
    return plan_placement(load_config(None, list(overrides)).runtime, list(cpus))


def test_disaggregated_process_workers_get_disjoint_pinned_cores() -> None:
    p = _plan("runtime.backend=process", "runtime.num_rollout_workers=2")
    assert not p.colocated
    assert p.trainer_cpus == (0, 1) and p.trainer_threads == 2
    assert p.worker_cpus == ((2,), (3,)) and p.worker_threads == 1
    p = _plan("runtime.backend=ray", "runtime.rollout_threads=2", "runtime.threads=1")
    assert p.trainer_cpus == (0,) and p.worker_cpus == ((1, 2),)


def test_one_core_each_on_two_cores_and_no_pinning_when_asked() -> None:
    p = _plan("runtime.backend=process", cpus=(0, 1))
    assert p.trainer_cpus == (0,) and p.worker_cpus == ((1,),)
    p = _plan("runtime.backend=process", "runtime.pin_cpus=false", cpus=(0, 1))
    assert p.trainer_cpus is None and p.worker_cpus == (None,)


def test_oversubscription_is_warned_and_cores_wrap(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="streamrl.placement"):
        p = _plan("runtime.backend=process", "runtime.num_rollout_workers=2", cpus=(0, 1))
    assert "cores are shared" in caplog.text
    assert p.trainer_cpus == (0,) and p.worker_cpus == ((1,), (0,))


def test_colocated_time_shares_every_core() -> None:
    p = _plan("runtime.backend=process", "runtime.placement=colocated")
    assert p.colocated and p.trainer_cpus is None and p.worker_cpus == (None,)
    assert p.trainer_threads == p.worker_threads == 4


def test_local_backend_shares_one_thread_count() -> None:
    p = _plan("runtime.backend=local")
    assert p.trainer_cpus is None and p.trainer_threads == p.worker_threads == 2


def test_auto_stays_disaggregated_when_the_trainer_waits_for_batches() -> None:
    from streamrl.stream.backends.placement import AutoPlacement

    auto = AutoPlacement(True, probe_steps=3)
    # the first step is start-up and is not counted; then wait/update = 0.5/1.0 >= 0.1
    assert auto.observe(9.0, 0.0, 1.0) is None
    for step, wait, update in [(1.5, 0.5, 1.0), (1.4, 0.4, 1.0), (1.6, 0.6, 1.0)]:
        assert auto.observe(step, wait, update) is None
    assert auto.phase == "fixed" and "disaggregated" in auto.decision
    assert auto.observe(0.1, 0.0, 5.0) is None  # decided once, for good


def test_auto_tries_time_sharing_when_the_trainer_is_the_bottleneck() -> None:
    from streamrl.stream.backends.placement import AutoPlacement

    auto = AutoPlacement(True, probe_steps=3)
    auto.observe(30.0, 0.0, 25.0)  # start-up
    auto.observe(25.0, 0.0, 25.0)
    auto.observe(26.0, 0.1, 25.0)
    assert auto.observe(24.0, 0.2, 24.0) is True  # median wait 0.1 < 0.1 x 25: time-share
    assert auto.observe(40.0, 3.0, 13.0) is None  # the transition step is not counted
    for step in (15.0, 16.0, 14.0):
        change = auto.observe(step, 2.0, 13.0)
    assert change is None  # median 15 < median 25 (disaggregated): keep time-sharing
    assert auto.decision == "step 15.00 s time-shared vs 25.00 s disaggregated: time-shared"


def test_auto_returns_to_disaggregated_when_time_sharing_is_slower() -> None:
    from streamrl.stream.backends.placement import AutoPlacement

    auto = AutoPlacement(True, probe_steps=2)
    for step in (9.0, 2.0, 2.0):
        change = auto.observe(step, 0.0, 2.0)
    assert change is True
    auto.observe(5.0, 1.0, 1.0)  # transition
    auto.observe(2.5, 1.0, 1.0)
    assert auto.observe(2.7, 1.0, 1.0) is False  # 2.6 s > 2.0 s: back to disaggregated
    assert auto.decision.endswith(": disaggregated")


class _Scripted:
    """Stands in for AutoPlacement: time-shares after step 2, stops after step 4."""

    def __init__(self, enabled: bool) -> None:
        self.step, self.decision = 0, ""

    def observe(self, step_s: float, wait_s: float, update_s: float) -> bool | None:
        self.step += 1
        if self.step == 4:
            self.decision = "scripted: disaggregated"
        return {2: True, 4: False}.get(self.step)


@pytest.mark.slow  # a run on the process backend
def test_placement_switches_mid_run_and_the_books_balance(tmp_path, monkeypatch) -> None:
    """The controller's side of runtime.placement=auto, without timing: switching to
    time-sharing (generation paused while the trainer, re-pinned to every core, trains)
    and back, on the process backend; every row says which, and nothing is lost."""
    import json

    import streamrl.run.rl
    from streamrl.run.launch import train

    monkeypatch.setattr(streamrl.run.rl, "AutoPlacement", _Scripted)
    cfg = load_config(
        "examples/smoke.yaml",
        [
            "runtime.placement=auto",
            "runtime.backend=process",
            "sft.steps=0",
            # an untrained model's groups are all wrong: dynamic sampling would keep drawing
            "algorithm.dynamic_sampling=false",
            "train.steps=6",
            "train.items_per_step=2",
            "eval.heldout_size=10",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    run_dir = train(cfg).run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["placement_auto"] == "scripted: disaggregated"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").open()]
    flags = [r["placement/time_shared"] for r in rows if "placement/time_shared" in r]
    assert flags == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert summary["stream/consumed"] == 6 * 2
    assert summary["stream/issued"] == summary["stream/consumed"] + summary["stream/filtered"]

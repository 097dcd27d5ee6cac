"""Placement: which cores and threads the trainer and each rollout worker get."""

from __future__ import annotations

import logging

from streamrl.backends import plan_placement
from streamrl.config import load_config


def _plan(*overrides: str, cpus=(0, 1, 2, 3)):
    return plan_placement(load_config(None, list(overrides)), list(cpus))


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

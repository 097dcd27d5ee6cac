"""Invariant 4 under worker failure: a rollout worker killed with SIGKILL (or hung)
is replaced, its in-flight items are issued again, and every item still ends
exactly once: none lost, none consumed twice. A trainer that cannot reach its
workers fails with a clear error instead of hanging."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from streamrl.models import load_model_and_tokenizer
from streamrl.run.assembly import rollout_spec
from streamrl.run.launch import train
from streamrl.sources import build_task_source
from streamrl.stream.backends import RolloutPool, WorkerSpec, WorkersUnreachable
from streamrl.stream.backends.process import ProcessBackend
from streamrl.stream.sample_stream import SampleStream, StreamClosed

pytestmark = pytest.mark.slow

B, STEPS = 4, 6


# 1-digit sums, 2 samples of up to 24 tokens per item, B items per step, eta = 1
RUN = [
    "data.options={digits: 1, operators: '+', heldout_size: 8}",
    "rollout.group_size=2",
    "rollout.max_new_tokens=24",
    "rollout.decode_slots=16",
    f"train.items_per_step={B}",
    f"train.steps={STEPS}",
    "algorithm.dynamic_sampling=false",
    "stream.max_staleness=1",
]


def _backend(kind: str, cfg, workers: int):
    model, tokenizer = load_model_and_tokenizer(cfg.model.name_or_path, seed=0)
    spec = WorkerSpec(rollout_spec(cfg), model.config, tokenizer)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    if kind == "process":
        backend = ProcessBackend(spec, workers, weights, worker_cpus=(None,) * workers, threads=1)
        return backend, weights, lambda: backend.pids
    ray = pytest.importorskip("ray")
    from streamrl.stream.backends.ray_actors import RayBackend, init_ray

    init_ray(None)
    backend = RayBackend(
        spec, workers, weights, worker_cpus=(None,) * workers, threads=1, num_cpus=0
    )
    assert ray.is_initialized()
    return backend, weights, backend.pids


def _pool(kind: str, cfg, workers: int, *, max_restarts: int, worker_timeout_s: float):
    """A started pool over a fresh backend and stream; the test stops it."""
    backend, weights, pids = _backend(kind, cfg, workers)
    stream = SampleStream(B, max_staleness=1)
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    pool = RolloutPool(
        backend,
        stream,
        source.train_iter(0),
        max_restarts=max_restarts,
        worker_timeout_s=worker_timeout_s,
    )
    pool.start()
    return pool, stream, weights, pids


def _wait_batch(pool: RolloutPool, stream: SampleStream, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool.raise_if_failed()
        groups = stream.get_batch(timeout=0.5)
        if groups is not None:
            return groups
    raise AssertionError("no batch within the timeout")


@pytest.mark.parametrize("kind", ["process", "ray"])
def test_sigkilled_worker_is_replaced_and_its_items_reissued(tiny_config, kind: str) -> None:
    cfg = tiny_config(*RUN)
    pool, stream, weights, pids = _pool(kind, cfg, 2, max_restarts=2, worker_timeout_s=60)
    consumed: list[int] = []
    lost: set[int] = set()
    try:
        pool.wait_version(0, timeout=120)
        worker_pids = pids()
        for step in range(STEPS):
            groups = _wait_batch(pool, stream)
            consumed += [g.item_index for g in groups]
            for g in groups:  # a whole group, never a mix of two attempts
                assert len(g.trajectories) == cfg.rollout.group_size
            pool.publish(weights, step + 1)
            stream.set_trainer_version(step + 1)
            if step == 1:  # new capacity: kill a worker as soon as one holds items
                deadline = time.monotonic() + 60
                while not lost:
                    assert time.monotonic() < deadline, "no worker ever held an item"
                    with pool._lock:  # the pump cannot hand out or take back items meanwhile
                        holders = [w for w in range(2) if pool.inflight[w]]
                        if holders:
                            lost = set(pool.inflight[holders[0]])
                            os.kill(worker_pids[holders[0]], signal.SIGKILL)
                    time.sleep(0.0005)
        pool.wait_version(STEPS, timeout=120)  # the replacement runs the latest weights
    finally:
        pool.stop()
        stream.close()
    assert pool.restarts == 1
    # re-issued: what it held, less reports already in the pipe when it died, plus
    # anything the pump handed it before noticing the death
    assert pool.reissued > 0
    assert len(consumed) == len(set(consumed)) == STEPS * B  # none consumed twice
    # eta = 1: an item admitted at version u is consumed by step u + 1, so every item
    # the dead worker held was redone and consumed within the remaining steps
    assert lost <= set(consumed)
    stream.check_accounting()
    assert sum(stream.stats.failed.values()) == 0


def test_hung_worker_is_declared_lost_after_the_timeout(tiny_config) -> None:
    cfg = tiny_config(*RUN)
    pool, stream, weights, pids = _pool("process", cfg, 1, max_restarts=1, worker_timeout_s=3)
    try:
        pool.wait_version(0, timeout=120)
        while not pool.inflight[0]:
            time.sleep(0.001)
        os.kill(pids()[0], signal.SIGSTOP)  # alive but silent
        groups = []
        for step in range(3):
            groups.append(_wait_batch(pool, stream))
            pool.publish(weights, step + 1)
            stream.set_trainer_version(step + 1)
    finally:
        pool.stop()
        stream.close()
    assert pool.restarts == 1 and pool.reissued > 0
    assert len({g.item_index for batch in groups for g in batch}) == 3 * B


def test_trainer_fails_clearly_when_workers_cannot_be_replaced(tiny_config) -> None:
    cfg = tiny_config(*RUN)
    pool, stream, _, pids = _pool("process", cfg, 1, max_restarts=0, worker_timeout_s=60)
    t0 = time.monotonic()
    try:
        pool.wait_version(0, timeout=120)
        os.kill(pids()[0], signal.SIGKILL)
        with pytest.raises(WorkersUnreachable, match="killed by SIGKILL.*max_worker_restarts=0"):
            while True:
                try:
                    _wait_batch(pool, stream, timeout=60)
                except StreamClosed:
                    raise AssertionError("stream closed instead of a clear error") from None
    finally:
        pool.stop()
        stream.close()
    assert time.monotonic() - t0 < 60  # failed fast, did not wait for a timeout


def test_train_survives_a_killed_process_worker(tiny_config) -> None:
    """The whole loop: kill a worker mid-run; the run completes and its books balance."""
    import threading

    cfg = tiny_config(
        *RUN, "runtime.backend=process", "runtime.num_rollout_workers=2", "train.steps=12"
    )
    killed: list[int] = []

    def kill_a_worker() -> None:  # the workers are our children running multiprocessing.spawn
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for pid in _children():
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"spawn_main" in cmd and time.monotonic() > t0 + 1:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.2)

    t0 = time.monotonic()
    threading.Thread(target=kill_a_worker, daemon=True).start()
    result = train(cfg)
    s = result.summary
    assert killed, "no worker process was found to kill"
    assert s["worker_restarts"] == 1
    assert s["stream/consumed"] == 12 * B
    done = s["stream/consumed"] + s["stream/filtered"] + s["stream/failed"]
    assert done == s["stream/issued"]  # controller also ran check_accounting()
    assert s["stream/failed"] == 0


def _children() -> list[int]:
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                out.append(int(d.name))
    return out


def test_unreachable_ray_address_fails_fast_with_a_clear_message() -> None:
    pytest.importorskip("ray")
    from streamrl.stream.backends.ray_actors import probe_address

    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot reach the Ray cluster.*127.0.0.1:9"):
        probe_address("127.0.0.1:9", timeout_s=2)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ValueError, match="HOST:PORT"):
        probe_address("nonsense")

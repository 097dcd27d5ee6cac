"""Each thread of the rollout side keeps the torch thread count it was given: torch would
otherwise set it lazily, at the thread's first op, from whatever count the trainer's
thread set last (``streamrl/engines/threads.py``)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import streamrl.engines.inference.engine as inference
import streamrl.engines.inference.quantize as quantize
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.threads import set_thread_torch_threads
from streamrl.stream.backends.local import LocalBackend
from tests.unit.engines.test_inference_engine import TickingWorker, tiny_llama


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _count_in_new_thread(set_count, trainer_count: int) -> int:
    """A thread sets its count, then the trainer's thread sets ``trainer_count``; the
    count the first thread runs its first op with."""
    ready, go, seen = threading.Event(), threading.Event(), []

    def run() -> None:
        set_count(1)
        ready.set()
        go.wait()
        torch.ones(64).add_(1)  # the thread's first op
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=run)
    t.start()
    ready.wait()
    torch.set_num_threads(trainer_count)
    go.set()
    t.join()
    return seen[0]


def test_torch_overwrites_a_count_set_before_the_threads_first_op():
    """The trap itself (torch 2.13): the plain call is undone by the lazy set-up."""
    assert _count_in_new_thread(torch.set_num_threads, trainer_count=2) == 2


def test_a_thread_keeps_the_count_it_set():
    assert _count_in_new_thread(set_thread_torch_threads, trainer_count=2) == 1


@pytest.mark.parametrize("threads, expected", [(1, 1), (None, 2)])
def test_the_rollout_thread_loads_weights_with_its_own_count(threads, expected):
    """The trainer sets two threads after the rollout thread started (as RL does when
    evaluation or SFT used every core): the worker's weight load still runs on its one
    thread. Without a count (None, as before) the load takes the trainer's two."""
    engine = LocalEngine(tiny_llama(), decode_slots=2, version=0)
    counts: list[int] = []
    load = engine._load_weights
    engine._load_weights = lambda sd, v: (counts.append(torch.get_num_threads()), load(sd, v))
    torch.set_num_threads(1)
    backend = LocalBackend(lambda w, emit: (engine, TickingWorker()), 1, threads=threads)
    backend.start()
    try:
        time.sleep(0.05)
        torch.set_num_threads(2)
        backend.publish({"lm_head.weight": torch.zeros_like(engine.model.lm_head.weight)}, 3)
        deadline = time.monotonic() + 30
        while engine.version != 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.version == 3
    finally:
        backend.close()
    assert counts == [expected]


def test_fp16_packing_threads_compute_on_one_thread_each(monkeypatch):
    """The packer pool is the load's parallelism: each of its threads computes on one
    torch thread, whatever the caller's count, so no OpenMP team outlives a load."""
    seen: list[tuple[str, int]] = []
    prepack = quantize._prepack

    def recording(job):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return prepack(job)

    monkeypatch.setattr(quantize, "_prepack", recording)
    monkeypatch.setattr(inference, "pack_threads", lambda: 2)  # a pool on any machine
    torch.set_num_threads(2)
    LocalEngine(tiny_llama(), decode_slots=2, weights="float16")
    pool = [n for name, n in seen if name.startswith("streamrl-pack")]
    assert pool and set(pool) == {1}

"""``runtime.lend_cores``: while the trainer waits for a batch, its thread runs the rollout
engine's steps (``LocalEngine.drive``). Driving changes which thread computes a step, not
what the step computes, and it stops as soon as the trainer has a batch."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.stream.sample_stream import Group, SampleStream
from tests.unit.engines.test_inference_engine import tiny_llama


def _requests(n: int = 6, tokens: int = 12) -> list[GenerationRequest]:
    sp = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    return [GenerationRequest([1, 2 + i, 3, 4 + 2 * i], sp, seed=100 + i) for i in range(n)]


def _slow_own_steps(engine: LocalEngine) -> None:
    """The engine's own thread steps slowly, so the driving thread gets steps to run."""

    def hook(e: LocalEngine) -> None:
        if threading.current_thread().name.startswith("streamrl-engine"):
            time.sleep(0.01)

    engine.on_step = hook


def _generate_in_background(engine: LocalEngine, requests: list[GenerationRequest]):
    """agenerate on its own event-loop thread, as the rollout worker calls it."""
    out: dict[str, list] = {}

    def run() -> None:
        async def all_of() -> list:
            return await asyncio.gather(*(engine.agenerate(r) for r in requests))

        out["results"] = asyncio.run(all_of())

    t = threading.Thread(target=run, name="rollout-test")
    t.start()
    deadline = time.monotonic() + 30
    while not engine._has_work() and time.monotonic() < deadline:
        time.sleep(0.001)
    return t, out


def test_driven_steps_compute_what_the_engines_own_steps_compute():
    reference = LocalEngine(tiny_llama(), decode_slots=4, version=0).generate(_requests())
    engine = LocalEngine(tiny_llama(), decode_slots=4, version=0)
    _slow_own_steps(engine)
    t, out = _generate_in_background(engine, _requests())
    driven = engine.drive(torch.get_num_threads(), until=lambda: False, min_step_s=0)
    t.join(30)
    engine.close()
    assert driven > 0 and engine.stats.driven_steps == driven
    assert [r.token_ids for r in out["results"]] == [r.token_ids for r in reference]
    assert [r.logprobs for r in out["results"]] == [r.logprobs for r in reference]
    assert [r.versions for r in out["results"]] == [r.versions for r in reference]


def test_driving_stops_when_asked_and_the_engines_thread_finishes_the_rest():
    engine = LocalEngine(tiny_llama(), decode_slots=4, version=0)
    _slow_own_steps(engine)
    t, out = _generate_in_background(engine, _requests(tokens=16))
    own_hook, on_main = engine.on_step, []

    def hook(e: LocalEngine) -> None:
        own_hook(e)
        if threading.current_thread() is threading.main_thread():
            on_main.append(1)

    engine.on_step = hook
    driven = engine.drive(1, until=lambda: len(on_main) >= 3, min_step_s=0)
    assert driven == 3
    t.join(60)
    engine.close()
    assert not t.is_alive()
    assert [len(r.token_ids) for r in out["results"]] == [16] * 6  # nothing lost or stuck
    assert engine.stats.driven_steps == driven


def test_driving_an_idle_or_paused_engine_runs_nothing():
    engine = LocalEngine(tiny_llama(), decode_slots=2, version=0)
    assert engine.drive(1, until=lambda: False) == 0  # no work
    engine.pause()
    t, out = _generate_in_background(engine, _requests(n=2, tokens=4))
    assert engine.drive(1, until=lambda: False) == 0  # paused: the trainer must not step it
    engine.resume()
    t.join(30)
    engine.close()
    assert len(out["results"]) == 2


def test_steps_cheaper_than_the_floor_are_left_to_the_engines_own_thread():
    """Steps of a few ms are mostly Python under the GIL: driving them only contends with
    the rollout thread, so the trainer does not drive them."""
    engine = LocalEngine(tiny_llama(), decode_slots=4, version=0)
    engine.generate(_requests(n=2, tokens=4))  # steps of about a millisecond on record
    t, out = _generate_in_background(engine, _requests())
    assert engine.drive(1, until=lambda: False, min_step_s=1.0) == 0
    t.join(30)
    engine.close()
    assert len(out["results"]) == 6 and engine.stats.driven_steps == 0


def test_the_backend_drives_only_where_it_pays(monkeypatch):
    """The trainer polls for its batch every 5 ms only where driving applies; where it
    does not (two engines, no step on record yet, steps under the floor), the backend
    says so without stepping, and the trainer looks again in 0.1 s instead of spinning."""
    import streamrl.engines.inference.engine as inference
    from streamrl.stream.backends.local import LocalBackend
    from tests.unit.engines.test_inference_engine import TickingWorker

    engines = [LocalEngine(tiny_llama(), decode_slots=4, version=0) for _ in range(2)]
    two = LocalBackend(lambda w, emit: (engines[w], TickingWorker()), 2)
    one = LocalBackend(lambda w, emit: (engines[0], TickingWorker()), 1)
    monkeypatch.setattr(inference, "DRIVE_MIN_STEP_S", 1e-9)
    assert not two.drive(1, until=lambda: False)  # one thread cannot step two engines
    assert not one.drive(1, until=lambda: False)  # no step on record: the cost is unknown
    engines[0].generate(_requests(n=2, tokens=4))
    assert one.drive(1, until=lambda: False)  # applies, though there is no work now
    _slow_own_steps(engines[0])
    t, out = _generate_in_background(engines[0], _requests())
    monkeypatch.setattr(inference, "DRIVE_MIN_STEP_S", 1.0)  # the tiny model's ~1 ms steps
    assert not one.drive(1, until=lambda: False)
    assert engines[0].stats.driven_steps == 0
    monkeypatch.setattr(inference, "DRIVE_MIN_STEP_S", 1e-9)
    assert one.drive(1, until=lambda: False)
    t.join(30)
    engines[0].close()
    assert len(out["results"]) == 6 and engines[0].stats.driven_steps > 0


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_has_batch_says_whether_get_batch_would_return_one(eta):
    """The trainer drives until ``has_batch``; it must agree with ``get_batch`` in every
    state of a random schedule, the staleness rule's waits included."""
    import random

    rng = random.Random(eta)
    stream = SampleStream(items_per_batch=2, max_staleness=eta)
    engine_version, version, pending = 0, 0, []
    for _ in range(400):
        move = rng.random()
        if move < 0.4:
            pending += stream.admit(engine_version, rng.randint(1, 3), timeout=0)
        elif move < 0.75 and pending:
            i = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.3:
                stream.reject(i, "filtered", "zero_variance")
            else:
                stream.put(Group(i, 0, []))
        elif move < 0.9:
            expected = stream.has_batch()
            batch = stream.get_batch(timeout=0)
            assert (batch is not None) == expected
            if batch is not None:
                version += 1
                stream.set_trainer_version(version)
        else:
            engine_version = version  # the engine loads the latest weights


@pytest.mark.parametrize("lend", [True, False])
def test_an_async_run_drives_only_where_lending_is_on(tiny_config, lend, monkeypatch):
    """A short RL run at eta = 1 on the local backend: the waiting trainer drives the
    engine (counted in ``rollout/driven_steps``), and the stream's books still balance.
    The tiny model's steps are below the floor, so the floor is lowered here."""
    import json

    import streamrl.engines.inference.engine as inference

    monkeypatch.setattr(inference, "DRIVE_MIN_STEP_S", 0.0)

    from streamrl.run.launch import train

    cfg = tiny_config(
        "algorithm.dynamic_sampling=false",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "train.items_per_step=2",
        "train.steps=4",
        "stream.max_staleness=1",
        f"runtime.lend_cores={str(lend).lower()}",
    )
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    driven = max(r.get("rollout/driven_steps", 0) for r in rows)
    assert (driven > 0) == lend
    last = rows[-1]  # logged before the stream closes: at most two batches still in flight
    assert last["stream/consumed"] == 4 * 2 and last["stream/failed"] == 0
    in_flight = last["stream/issued"] - last["stream/consumed"] - last["stream/filtered"]
    assert 0 <= in_flight <= 2 * 2

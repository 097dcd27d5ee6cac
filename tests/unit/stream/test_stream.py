"""Staleness bound and sample accounting of the SampleStream under random schedules."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from streamrl.core.types import Trajectory
from streamrl.stream.sample_stream import Group, SampleStream, StreamClosed, staleness_metrics


def _traj(versions: list[int], index: int) -> Trajectory:
    n = len(versions) + 2  # two prompt tokens
    return Trajectory(
        input_ids=torch.zeros(n, dtype=torch.long),
        loss_mask=torch.tensor([False, False] + [True] * len(versions)),
        behavior_logprobs=torch.zeros(n),
        versions=torch.tensor([-1, -1] + versions),
        reward=0.0,
        item_index=index,
    )


class FakeEngine:
    """Weight version that lags the trainer by a random delay, like a real sync."""

    def __init__(self) -> None:
        self.version = 0
        self.lock = threading.Lock()

    def publish(self, version: int, rng: random.Random) -> None:
        def apply() -> None:
            time.sleep(rng.random() * 0.002)
            with self.lock:
                self.version = max(self.version, version)

        threading.Thread(target=apply, daemon=True).start()


def _run_schedule(seed: int, eta: int, batch: int, steps: int, producers: int) -> None:
    rng = random.Random(seed)
    stream = SampleStream(items_per_batch=batch, max_staleness=eta)
    engine = FakeEngine()
    outcome: dict[int, str] = {}
    outcome_lock = threading.Lock()
    errors: list[BaseException] = []

    def record(index: int, what: str) -> None:
        with outcome_lock:
            assert index not in outcome, f"item {index} ended twice"
            outcome[index] = what

    def producer(pid: int) -> None:
        prng = random.Random(seed * 100 + pid)
        try:
            while True:
                admit_version = engine.version
                indices = stream.admit(admit_version, prng.randint(1, 3), timeout=0.05)
                for index in indices:
                    time.sleep(prng.random() * 0.003)  # generation time varies
                    roll = prng.random()
                    if roll < 0.15:
                        stream.reject(index, "filtered", "zero_std")
                        record(index, "filtered")
                        continue
                    if roll < 0.2:
                        stream.reject(index, "failed", "reward_error")
                        record(index, "failed")
                        continue
                    # interruptible generation: later tokens may carry newer versions
                    lo, hi = admit_version, max(admit_version, engine.version)
                    versions = sorted(prng.randint(lo, hi) for _ in range(4))
                    stream.put(Group(index, -1, [_traj(versions, index) for _ in range(2)]))
        except StreamClosed:
            return
        except BaseException as e:  # surfaced by the main thread
            errors.append(e)

    threads = [threading.Thread(target=producer, args=(p,), daemon=True) for p in range(producers)]
    for t in threads:
        t.start()
    try:
        for step in range(steps):
            groups = stream.get_batch(timeout=10)
            assert groups is not None, "consumer starved"
            assert len(groups) == batch
            assert [g.item_index for g in groups] == sorted(g.item_index for g in groups)
            lag = staleness_metrics(groups, stream.trainer_version)
            assert lag["staleness/max"] <= eta, (step, lag)
            for g in groups:
                record(g.item_index, "consumed")
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.003)  # training time varies
            stream.set_trainer_version(step + 1)
            engine.publish(step + 1, rng)
    finally:
        stream.close()
        for t in threads:
            t.join(timeout=5)
    assert not errors, errors
    stream.check_accounting()
    s = stream.stats
    assert s.consumed == steps * batch
    # every issued index ended exactly once, and the stream's counters agree
    leftovers = s.filtered["run_ended"]
    assert len(outcome) + leftovers == s.issued
    assert sum(1 for v in outcome.values() if v == "consumed") == s.consumed
    assert sum(1 for v in outcome.values() if v == "failed") == sum(s.failed.values())
    assert sum(1 for v in outcome.values() if v == "filtered") == s.filtered["zero_std"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("eta", [0, 1, 3])
def test_staleness_bound_and_accounting_random_schedules(seed: int, eta: int) -> None:
    _run_schedule(seed=seed, eta=eta, batch=4, steps=25, producers=3)


def test_eta_zero_admits_exactly_one_batch_per_version() -> None:
    stream = SampleStream(items_per_batch=3, max_staleness=0)
    assert stream.admit(0, 10) == [0, 1, 2]
    assert stream.admit(0, 10, timeout=0.01) == []  # nothing more at version 0
    for i in range(3):
        stream.put(Group(i, -1, [_traj([0, 0], i)]))
    assert [g.item_index for g in stream.get_batch()] == [0, 1, 2]
    stream.set_trainer_version(1)
    assert stream.admit(0, 10, timeout=0.01) == []  # engine still on old weights
    assert stream.admit(1, 10) == [3, 4, 5]


def test_forced_oldest_items_wait_for_slow_group() -> None:
    """An old item that is still generating must be consumed before it goes stale."""
    stream = SampleStream(items_per_batch=1, max_staleness=1)
    assert stream.admit(0, 5) == [0, 1]
    stream.put(Group(1, -1, [_traj([0], 1)]))  # item 1 overtakes item 0
    assert [g.item_index for g in stream.get_batch()] == [1]
    stream.set_trainer_version(1)
    assert stream.admit(1, 5) == [2]
    stream.put(Group(2, -1, [_traj([1], 2)]))
    # at trainer version 1, item 0 (admitted at 0) is forced: the batch waits for it
    assert stream.get_batch(timeout=0.05) is None
    stream.put(Group(0, -1, [_traj([0], 0)]))
    assert [g.item_index for g in stream.get_batch()] == [0]


def test_misuse_is_rejected() -> None:
    stream = SampleStream(items_per_batch=2, max_staleness=1)
    with pytest.raises(ValueError, match="not outstanding"):
        stream.put(Group(7, -1, []))
    (i, _j) = stream.admit(0, 2)
    stream.reject(i, "failed", "boom")
    with pytest.raises(ValueError, match="not outstanding"):
        stream.reject(i, "failed", "boom")
    with pytest.raises(ValueError, match="outcome"):
        stream.reject(_j, "lost", "x")
    stream.close()
    with pytest.raises(StreamClosed):
        stream.admit(0, 1)
    stream.check_accounting()
    assert stream.stats.filtered["run_ended"] == 1


def test_newer_ready_items_never_push_older_ones_past_the_bound() -> None:
    """B=1, eta=2: items 0 and 1 (version 0) are slow. Taking newer ready items
    ahead of them twice would leave both forced into the one slot of batch 2."""
    stream = SampleStream(items_per_batch=1, max_staleness=2)
    assert stream.admit(0, 5) == [0, 1, 2]
    stream.put(Group(2, -1, [_traj([0], 2)]))
    assert [g.item_index for g in stream.get_batch(timeout=1)] == [2]  # still safe
    stream.set_trainer_version(1)
    assert stream.admit(1, 5) == [3]
    stream.put(Group(3, -1, [_traj([1], 3)]))
    assert stream.get_batch(timeout=0.05) is None  # taking 3 now would doom 0 and 1
    stream.put(Group(0, -1, [_traj([0], 0)]))
    assert [g.item_index for g in stream.get_batch(timeout=1)] == [0]
    stream.set_trainer_version(2)
    stream.put(Group(1, -1, [_traj([0], 1)]))
    assert [g.item_index for g in stream.get_batch(timeout=1)] == [1]  # forced, and it fits
    stream.check_accounting()

"""The process backend's shared-memory weight channel (a sequence lock)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
import torch.multiprocessing as tmp

from streamrl.stream.backends.shared_weights import SharedWeights

CTX = tmp.get_context("spawn")


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((4, 3), value), "b": torch.full((5,), value)}


def test_read_returns_the_published_snapshot_and_version() -> None:
    shared = SharedWeights(_weights(0.0), 0, CTX)
    assert shared.nbytes == (12 + 5) * 4
    shared.publish(_weights(2.5), 7)
    out = {k: torch.empty_like(v) for k, v in shared.tensors.items()}
    assert shared.read_into(out) == 7
    assert all(torch.equal(out[k], v) for k, v in _weights(2.5).items())


def test_a_read_overlapping_a_write_is_discarded() -> None:
    shared = SharedWeights(_weights(0.0), 0, CTX)

    class PublishMidRead(dict):
        """Publishes version 1 while the reader is between its two tensors."""

        def __getitem__(self, key):
            if key == "b":
                shared.publish(_weights(1.0), 1)
            return super().__getitem__(key)

    out = PublishMidRead({k: torch.empty_like(v) for k, v in shared.tensors.items()})
    assert shared.read_into(out) is None  # "a" came from version 0, "b" from version 1
    clean = {k: torch.empty_like(v) for k, v in shared.tensors.items()}
    assert shared.read_into(clean) == 1
    shared.seq.value += 1  # a writer in progress
    assert shared.read_into(clean) is None


def _read_forever(shared: SharedWeights) -> None:
    out = {k: torch.empty_like(v) for k, v in shared.tensors.items()}
    while True:
        shared.read_into(out)


@pytest.mark.slow
def test_a_reader_killed_mid_read_never_blocks_the_writer() -> None:
    shared = SharedWeights({"w": torch.zeros(2_000_000)}, 0, CTX)
    proc = CTX.Process(target=_read_forever, args=(shared,), daemon=True)
    proc.start()
    time.sleep(3.0)  # let it import torch and start copying
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    done = threading.Event()
    threading.Thread(
        target=lambda: (shared.publish({"w": torch.ones(2_000_000)}, 1), done.set()), daemon=True
    ).start()
    assert done.wait(30), "publish blocked on a dead reader"
    assert shared.version.value == 1


def test_ray_object_store_form_round_trips_every_dtype() -> None:
    from streamrl.stream.backends.ray_actors import _from_object_store, _to_object_store

    sd = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "f16": torch.randn(2, 2).to(torch.float16),
    }
    back = _from_object_store(_to_object_store(sd))
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k

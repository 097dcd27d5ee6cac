"""Weights through shared memory: the process backend's weight channel.

The trainer owns one shared-memory copy of the inference weights. Each worker
process maps it once, when it is spawned; after that nothing is pickled.

Synchronisation is a sequence lock, not a mutex: a worker killed with SIGKILL in
the middle of reading must never leave a lock held that the trainer then waits on
forever. The single writer (the trainer) makes the sequence number odd, copies
the new weights in, sets the version, and makes it even again. A reader copies
the buffer out and keeps the copy only if the sequence number was the same even
value before and after; otherwise it tries again at its next tick. The copy goes
to the worker's engine, which loads it between two decode steps.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class SharedWeights:
    """A versioned set of shared-memory tensors with one writer."""

    def __init__(self, state_dict: dict[str, torch.Tensor], version: int, ctx: Any) -> None:
        self.tensors = {
            k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state_dict.items()
        }
        self.seq = ctx.Value("q", 0, lock=False)  # odd while the writer is copying
        self.version = ctx.Value("q", version, lock=False)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> float:
        """Copy ``state_dict`` in and set ``version``; returns the seconds it took."""
        t0 = time.perf_counter()
        missing = self.tensors.keys() - state_dict.keys()
        if missing:
            raise KeyError(f"published weights lack {sorted(missing)[:3]}...")
        self.seq.value += 1
        with torch.no_grad():
            for k, t in self.tensors.items():
                t.copy_(state_dict[k])
        self.version.value = version
        self.seq.value += 1
        return time.perf_counter() - t0

    def read_into(self, out: dict[str, torch.Tensor]) -> int | None:
        """Copy a consistent snapshot into ``out``; its version, or None if a write overlapped."""
        before = self.seq.value
        if before % 2:
            return None
        with torch.no_grad():
            for k, t in self.tensors.items():
                out[k].copy_(t)
        version = self.version.value
        return version if self.seq.value == before else None


class SharedWeightsReader:
    """Worker side: loads a newer shared version into ``engine`` when it can."""

    def __init__(self, shared: SharedWeights, engine: Any) -> None:
        self.shared, self.engine = shared, engine
        self.loaded = -(2**62)
        self.retries = 0  # reads discarded because the trainer wrote meanwhile
        # a private copy the engine loads from, so the trainer can publish again
        # while the engine is still waiting for a step boundary
        self._local = {k: torch.empty_like(t) for k, t in shared.tensors.items()}

    def tick(self) -> None:
        if self.shared.version.value <= self.loaded or self.engine.has_pending_weights:
            return
        version = self.shared.read_into(self._local)
        if version is None:
            self.retries += 1
            return
        self.engine.update_weights(self._local, version)
        self.loaded = version

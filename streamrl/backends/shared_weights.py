"""Weights through shared memory: the process backend's weight channel.

The trainer owns one shared-memory copy of the inference weights. ``publish``
copies new weights into it under a lock and bumps the version; each worker
process polls the version between scheduler iterations and, when it changed,
copies the buffer out under the same lock and hands the copy to its engine,
which loads it between two decode steps. Nothing is pickled after start-up: the
tensors' memory is mapped into every worker once, when the worker is spawned.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class SharedWeights:
    """A versioned, lock-protected set of shared-memory tensors."""

    def __init__(self, state_dict: dict[str, torch.Tensor], version: int, ctx: Any) -> None:
        self.tensors = {
            k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state_dict.items()
        }
        self.lock = ctx.Lock()
        self.version = ctx.Value("q", version, lock=False)  # written only under self.lock

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> float:
        """Copy ``state_dict`` in and set ``version``; returns the seconds it took."""
        t0 = time.perf_counter()
        missing = self.tensors.keys() - state_dict.keys()
        if missing:
            raise KeyError(f"published weights lack {sorted(missing)[:3]}...")
        with self.lock, torch.no_grad():
            for k, t in self.tensors.items():
                t.copy_(state_dict[k])
            self.version.value = version
        return time.perf_counter() - t0


class SharedWeightsReader:
    """Worker side: loads a newer shared version into ``engine`` when it can."""

    def __init__(self, shared: SharedWeights, engine: Any) -> None:
        self.shared, self.engine = shared, engine
        self.loaded = -(2**62)
        # a private copy the engine loads from, so the trainer can publish again
        # while the engine is still waiting for a step boundary
        self._local = {k: torch.empty_like(t) for k, t in shared.tensors.items()}

    def tick(self) -> None:
        if self.shared.version.value <= self.loaded or self.engine.has_pending_weights:
            return
        with self.shared.lock, torch.no_grad():
            for k, t in self.shared.tensors.items():
                self._local[k].copy_(t)
            version = self.shared.version.value
        self.engine.update_weights(self._local, version)
        self.loaded = version

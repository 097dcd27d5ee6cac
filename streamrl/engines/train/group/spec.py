"""What a rank group is (its spec) and how it fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Placement = Literal["local", "ray"]


class RankGroupFailed(RuntimeError):
    """A rank died, or a collective timed out: the group must be torn down and restarted
    (from the last checkpoint)."""


@dataclass(frozen=True)
class GroupSpec:
    """A rank group's shape: ``world_size`` ranks on ``placement``, each with ``threads``
    torch threads, collectives that fail after ``collective_timeout_s``."""

    world_size: int
    placement: Placement = "local"
    ray_strategy: str = "STRICT_PACK"
    collective_timeout_s: float = 300.0
    device: str = "cpu"
    threads: int = 1

    @property
    def backend(self) -> str:
        """gloo on CPU, NCCL on CUDA."""
        return "nccl" if self.device.startswith("cuda") else "gloo"

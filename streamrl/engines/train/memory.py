"""Per-rank memory of a train engine: the bytes its training state holds on this rank
(parameters, gradients, optimizer state: local shards only under FSDP) and the
process's peak resident set."""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(t: torch.Tensor) -> int:
    return _local(t).numel() * t.element_size()


def training_state_bytes(engine: Any) -> dict[str, int]:
    """{"param_bytes", "grad_bytes", "optim_bytes", "peak_rss_bytes"} of this rank.

    Parameters: every distinct parameter of the model and its trained extras (frozen
    ones included); gradients: those present now; optimizer: every tensor in its state.
    """
    modules = [engine.model, *engine.extras, *getattr(engine, "owned", {}).values()]
    params = {id(p): p for m in modules for p in m.parameters()}
    grads = [p.grad for p in params.values() if p.grad is not None]
    optim = [
        v
        for state in engine.optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    ]
    return {
        "param_bytes": sum(_bytes(p) for p in params.values()),
        "grad_bytes": sum(_bytes(g) for g in grads),
        "optim_bytes": sum(_bytes(v) for v in optim),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024

"""Run a function on N gloo ranks (spawned processes on 127.0.0.1, a free port) and
collect each rank's return value. ``limit_bytes`` caps each rank's address space
(RLIMIT_AS) before it imports the model: a per-process memory budget."""

from __future__ import annotations

import os
import resource
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int,
    fn: Callable,
    world_size: int,
    port: int,
    out: str,
    args: tuple,
    limit_bytes: int | None,
) -> None:
    if limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        result = fn(rank, *args)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(
    fn: Callable, world_size: int, *args: Any, limit_bytes: int | None = None
) -> list[Any]:
    """``fn(rank, *args)`` on each of ``world_size`` ranks; their results, by rank. A
    rank that fails raises here (``torch.multiprocessing.ProcessRaisedException``, or
    ``ProcessExitedException`` when it was killed)."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(
            _entry,
            args=(fn, world_size, free_port(), out, args, limit_bytes),
            nprocs=world_size,
            join=True,
        )
        return [
            torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world_size)
        ]

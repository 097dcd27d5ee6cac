"""Joining and leaving the process group, for every placement: one rendezvous over TCP
(rank 0's address and a free port), gloo on CPU and NCCL on CUDA, with a timeout on the
rendezvous and on every collective."""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from streamrl.engines.train.group.spec import GroupSpec

#: how long a follower waits for rank 0's next command (rank 0 may roll out for a long
#: time between two updates); a dead rank 0 still ends the wait at once (closed socket)
COMMAND_TIMEOUT = timedelta(days=7)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def join(spec: GroupSpec, rank: int, addr: str, port: int) -> None:
    """Join the group as ``rank``: the default process group with ``collective_timeout_s``
    on the rendezvous and every collective."""
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device).index or 0)
    dist.init_process_group(
        spec.backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.collective_timeout_s),
    )


def command_group(spec: GroupSpec) -> dist.ProcessGroup:
    """A gloo group over every rank for rank 0's commands. A follower's wait for the next
    command does not time out (rank 0 may roll out for a long time between two calls; a
    dead rank 0 still ends it at once: a closed socket); rank 0's side of it keeps
    ``collective_timeout_s`` (each process sets its own side's timeout), so a hung
    follower fails rank 0's send. Every rank calls it once, in the same order."""
    lead = dist.get_rank() == 0
    timeout = timedelta(seconds=spec.collective_timeout_s) if lead else COMMAND_TIMEOUT
    return dist.new_group(backend="gloo", timeout=timeout)


def leave() -> None:
    """Leave the process group (nothing if none): a new one can then be joined."""
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):  # a broken group may fail to say goodbye
            dist.destroy_process_group()

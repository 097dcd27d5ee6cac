"""Trivial rank programs for the rank-group tests (a light module: a spawned follower
imports it, so it imports little)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from streamrl.engines.train.group.rendezvous import command_group
from streamrl.engines.train.group.spec import GroupSpec


def add_ranks(spec: GroupSpec) -> None:
    """For each command from rank 0, all_reduce (rank + 1); stop on None."""
    commands = command_group(spec)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=commands)
        if box[0] is None:
            return
        dist.all_reduce(torch.full((2,), float(dist.get_rank() + 1)))


def _fail_to_load() -> None:
    raise SystemExit("this rank cannot start")


class Unloadable:
    """An argument a spawned follower cannot unpickle: it dies before it starts."""

    def __reduce__(self):
        return (_fail_to_load, ())

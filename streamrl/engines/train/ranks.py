"""Rank 0 drives, the other ranks follow: one call at a time over ``torch.distributed``.

The controller holds :class:`RankZero` around rank 0's engine and uses it as a train
engine. Each public method call is first broadcast from rank 0 as (method, args,
kwargs) with ``broadcast_object_list``, then run locally; every other rank runs
:func:`follow`, which receives the same call and runs it on its own engine, until rank 0
sends ``stop``. Every rank therefore enters the same collectives in the same order.

A model the engine made (a frozen reference) cannot travel by pickle: the engine names
it (``_streamrl_handle``) and keeps it in ``engine.owned``; a call that passes it sends
the name, and each follower passes its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

STOP = "stop"
SETATTR = "__setattr__"


def rank_rows(n: int, rank: int, world_size: int) -> torch.Tensor:
    """The row indices of an ``n``-row batch that ``rank`` runs: contiguous, the first
    ``n % world_size`` ranks one row more (a rank may get none)."""
    return torch.arange(n).tensor_split(world_size)[rank]


@dataclass(frozen=True)
class Handle:
    """A model the engine owns, by name (see ``engine.owned``)."""

    name: str


def _to_wire(value: Any) -> Any:
    handle = getattr(value, "_streamrl_handle", None)
    if isinstance(value, torch.nn.Module) and handle is not None:
        return Handle(handle)
    return value


def _from_wire(engine: Any, value: Any) -> Any:
    return engine.owned[value.name] if isinstance(value, Handle) else value


def _broadcast(message: Any = None, group: Any = None) -> Any:
    box = [message]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _run(engine: Any, method: str, args: tuple, kwargs: dict) -> Any:
    args = tuple(_from_wire(engine, a) for a in args)
    kwargs = {k: _from_wire(engine, v) for k, v in kwargs.items()}
    if method == SETATTR:
        return setattr(engine, *args)
    return getattr(engine, method)(*args, **kwargs)


def follow(engine: Any, group: Any = None) -> None:
    """A follower rank's loop: run each call rank 0 broadcasts, until ``stop``. ``group``:
    the process group the calls travel on (default: the default group)."""
    while True:
        method, args, kwargs = _broadcast(None, group)
        if method == STOP:
            return
        _run(engine, method, args, kwargs)


class RankZero:
    """Rank 0's engine, as the controller uses it: each public method call is broadcast
    to the followers and then run here; attributes are read from the local engine and
    assignments are sent too (``trainer.micro_batch_sequences = 8``)."""

    def __init__(self, engine: Any, group: Any = None) -> None:
        object.__setattr__(self, "engine", engine)
        object.__setattr__(self, "group", group)  # the calls' process group (follow's)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.engine, name)
        if name.startswith("_") or not callable(value) or isinstance(value, torch.nn.Module):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            wire = (
                name,
                tuple(_to_wire(a) for a in args),
                {k: _to_wire(v) for k, v in kwargs.items()},
            )
            _broadcast(wire, self.group)
            return _run(self.engine, *wire)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        wire = (SETATTR, (name, _to_wire(value)), {})
        _broadcast(wire, self.group)
        _run(self.engine, *wire)

    def stop(self) -> None:
        """Release the followers (each returns from :func:`follow`)."""
        _broadcast((STOP, (), {}), self.group)

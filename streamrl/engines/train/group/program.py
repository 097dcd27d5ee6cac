"""What the ranks run: rank 0 names the engine to build (a picklable builder and its
arguments), every rank builds it, and the followers then execute rank 0's calls
(:func:`streamrl.engines.train.ranks.follow`) until it releases them.

Orders travel on :func:`~streamrl.engines.train.group.rendezvous.command_group`, whose
wait never times out (rank 0 may roll out for a long time between two calls); the work
inside a call keeps ``collective_timeout_s``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from streamrl.engines.train.group.rendezvous import command_group
from streamrl.engines.train.group.spec import GroupSpec


def _exchange(group: Any, order: Any = None) -> Any:
    box = [order]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def serve_rank(spec: GroupSpec) -> None:
    """A follower's program: build the engine rank 0 orders, then follow its calls (an
    order of None: nothing to build, leave)."""
    from streamrl.engines.train.ranks import follow

    commands = command_group(spec)
    order = _exchange(commands)
    if order is None:
        return
    build, args, kwargs = order
    follow(build(*args, **kwargs), commands)


class Lead:
    """Rank 0's side of :func:`serve_rank`: ``build`` the engine on every rank and get
    rank 0's proxy (:class:`~streamrl.engines.train.ranks.RankZero`); ``release`` the
    followers at the end. Made right after rank 0 joins (every rank makes the command
    group in the same order)."""

    def __init__(self, spec: GroupSpec) -> None:
        self.commands = command_group(spec)
        self.trainer: Any = None
        self.ordered = False

    def build(
        self, build: Callable[..., Any], *args: Any, here: dict | None = None, **kwargs: Any
    ) -> Any:
        """``build(*args, **kwargs)`` on every rank (``here``: keyword arguments for rank 0
        only, e.g. the model it has loaded already); returns rank 0's proxy."""
        from streamrl.engines.train.ranks import RankZero

        _exchange(self.commands, (build, args, kwargs))
        self.ordered = True
        self.trainer = RankZero(build(*args, **{**kwargs, **(here or {})}), self.commands)
        return self.trainer

    def release(self) -> None:
        """Let the followers leave (their programs return)."""
        if self.trainer is not None:
            self.trainer.stop()
        elif not self.ordered:
            _exchange(self.commands, None)

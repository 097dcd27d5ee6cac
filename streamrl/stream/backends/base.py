"""The backend interface: how the controller reaches its rollout workers.

A backend moves three things and nothing else: commands to a worker (``send``),
reports from every worker (``poll``), and weights to every worker (``publish``).
It also tells which workers died and replaces them. Everything that decides
*what* to send (admission, re-issuing a dead worker's items, accounting) lives in
:class:`streamrl.stream.pool.RolloutPool`, shared by every backend.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Protocol

import torch

from streamrl.core.messages import Command, Report


def drain(q: queue.SimpleQueue) -> list:
    """Everything in ``q`` right now, without blocking."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


class WorkerLost(RuntimeError):
    """A worker is gone (killed, crashed, unreachable)."""


class Backend(Protocol):
    """What every backend implements; ``drive`` has a default (backends derive from this
    class to inherit it)."""

    name: str
    num_workers: int
    #: the pool may replace a dead worker (False: a dead worker is a bug, fail the run)
    restartable: bool
    #: how often the pool polls this backend for reports (None: the pool's own interval)
    poll_interval_s: float | None = None

    def start(self) -> None:
        """Start every worker (returns before they are ready; they report a version)."""

    def send(self, worker: int, command: Command) -> None:
        """Deliver one command (thread-safe); raises :class:`WorkerLost` if the worker is gone."""

    def poll(self) -> list[tuple[int, Report]]:
        """Every report that arrived since the last call, as (worker, report)."""

    def dead(self) -> dict[int, str]:
        """Workers that are gone, with why. Their last reports were returned by poll."""

    def restart(self, worker: int) -> None:
        """Replace a dead (or hung) worker by a fresh one with the latest weights."""

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Make ``version`` of the weights available to every worker."""

    def close(self) -> None:
        """Stop every worker and release resources (idempotent)."""

    def drive(self, threads: int, until: Callable[[], bool]) -> bool:
        """Run the rollout engine's steps on the calling thread until ``until()`` is true
        (``runtime.lend_cores``). False, having run nothing, where the engines do not
        share this process (the default)."""
        return False

"""The rank group on this machine: rank 0 is this process, ranks 1..N-1 are spawned
processes (``torch.multiprocessing``, spawn context) that rendezvous on 127.0.0.1 and a
free port.

A follower whose parent dies exits at once (it polls its parent), so a killed run leaves
no rank behind; :meth:`LocalGroup.close` joins the followers, kills the ones that do not
leave, and leaves the process group, so a new group can start in this process."""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from streamrl.core.parent import exit_with_parent, ignore_stop_signals
from streamrl.engines.train.group.rendezvous import free_port, join, leave
from streamrl.engines.train.group.spec import GroupSpec, RankGroupFailed

HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0  # for a follower to start (import torch and the program)


def follower_main(
    rank: int,
    spec: GroupSpec,
    port: int,
    parent: int,
    started: Any,
    program: Callable,
    args: tuple,
) -> None:
    """A spawned follower: say it has started, join the group, run ``program(spec,
    *args)``, leave. Exits 1 (traceback on stderr) if the program raises, e.g. when rank 0
    is gone."""
    exit_with_parent(parent)
    ignore_stop_signals()  # rank 0 stops the group; a Ctrl-C reaches every process
    torch.set_num_threads(spec.threads)
    started.put(rank)
    try:
        join(spec, rank, HOST, port)
        program(spec, *args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    leave()


class LocalGroup:
    """``spec.world_size`` ranks on this machine; ``start()`` joins this process as rank 0."""

    def __init__(self, spec: GroupSpec, program: Callable, args: tuple = ()) -> None:
        self.spec, self.program, self.args = spec, program, args
        self.procs: list[Any] = []

    def start(self) -> LocalGroup:
        """Spawn ranks 1..N-1, wait until they have started (a follower that dies first
        fails the start at once), and rendezvous with them (within
        ``collective_timeout_s``)."""
        port = free_port(HOST)
        ctx = mp.get_context("spawn")
        started = ctx.Queue()
        for rank in range(1, self.spec.world_size):
            p = ctx.Process(
                target=follower_main,
                args=(rank, self.spec, port, os.getpid(), started, self.program, self.args),
                name=f"streamrl-rank{rank}",
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        try:
            self._await_started(started)
            join(self.spec, 0, HOST, port)
        except Exception as e:
            self.close(grace_s=0)
            raise RankGroupFailed(f"the rank group did not assemble: {self.failure() or e}") from e
        return self

    def _await_started(self, started: Any) -> None:
        waiting = set(range(1, self.spec.world_size))
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            if self.failure() is not None:
                raise RankGroupFailed(self.failure())
            if time.monotonic() > deadline:
                raise RankGroupFailed(f"ranks {sorted(waiting)} did not start")
            with contextlib.suppress(queue.Empty):
                waiting.discard(started.get(timeout=0.2))

    def failure(self, wait_s: float = 0.0) -> str | None:
        """Which followers have exited and how (None while all run); ``wait_s``: give a
        follower that is dying (its connections already closed) that long to be gone."""
        deadline = time.monotonic() + wait_s
        while self._exited() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._exited()

    def _exited(self) -> str | None:
        dead = [f"rank {r} exited with {p.exitcode}" for r, p in self.ranks() if not p.is_alive()]
        return ", ".join(dead) or None

    def ranks(self) -> list[tuple[int, Any]]:
        return list(enumerate(self.procs, start=1))

    def pids(self) -> dict[int, int]:
        """rank -> process id of every follower."""
        return {r: p.pid for r, p in self.ranks()}

    def close(self, grace_s: float = 10.0) -> None:
        """Wait up to ``grace_s`` for the followers to leave, kill those still running,
        and leave the process group."""
        deadline = time.monotonic() + grace_s
        for _, p in self.ranks():
            p.join(max(0.0, deadline - time.monotonic()))
        for _, p in self.ranks():
            if p.is_alive():
                p.kill()
                p.join(5.0)
        leave()

    def __enter__(self) -> LocalGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close(grace_s=0 if exc[0] is not None else 10.0)

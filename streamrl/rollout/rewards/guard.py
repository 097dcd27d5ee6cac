"""Run reward functions so that one that raises, hangs or crashes is a recorded failure.

``guard.call(fn, completion, item)`` returns an :class:`Outcome` (a finite float, or an error
text such as ``"timeout after 2.0s"``) within about ``timeout_s`` of the call starting, after
at most ``max_queue_wait_s`` waiting for a worker. ``backend="thread"``: worker threads and a
watchdog; a hung thread cannot be killed, so it is abandoned at the deadline and replaced, up
to ``max_hung`` of them (then the pool shrinks; with no healthy worker, calls fail at once).
A segfault, memory exhaustion or C code holding the GIL still takes the process down.
``backend="process"``: ``pebble`` workers (``forkserver``, never ``fork``), killed at the
deadline, replaced when they die, and allowed ``memory_limit_mb`` of address space past their
start-up size (``RLIMIT_AS``): a ``MemoryError`` ends the worker, leak and all. Costs: pickling
(~0.1-1 ms a call); module-level functions (or partials) only; heavy imports in ``preload``.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import multiprocessing as mp
import os
import queue
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

import pebble

_MEMORY_EXIT = 87  # exit code of a process worker after a MemoryError in a reward


@dataclass(frozen=True)
class Scored:
    """A reward's value with what it found out along the way (a reward may return this
    instead of a float): ``report``, JSON data kept in the sample's
    ``metadata["reward_reports"][<component>]``, and ``metrics``, numbers each answer
    adds to the step's metrics (their mean per episode)."""

    value: float
    report: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.value)


@dataclass
class Outcome:
    """The result of one guarded call: ``value`` (a finite float, or for a group reward
    a list of them) or ``error`` (text); ``scored`` when the reward returned a
    :class:`Scored`."""

    value: Any
    error: str | None = None
    scored: Scored | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class GuardError(Exception):
    """A failure reported by the guard itself; its text is the complete description."""


def describe_error(exc: BaseException) -> str:
    """``"Type: message (file.py:line in function)"``: the traceback's last line and frame.

    >>> try:
    ...     int("x")
    ... except ValueError as e:
    ...     describe_error(e).split(" (")[0]
    "ValueError: invalid literal for int() with base 10: 'x'"
    """
    if isinstance(exc, GuardError):
        return str(exc)
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()
    for last in traceback.extract_tb(exc.__traceback__)[-1:]:
        text += f" ({os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text


def _as_values(value: Any) -> Outcome:
    """A group reward's result, already checked where it ran (``group.run_group``): a list
    of values (a ``group.Scores`` keeps its details)."""
    return Outcome(value)


def _to_outcome(value: Any) -> Outcome:
    if isinstance(value, Scored):
        outcome = _to_outcome(value.value)
        return Outcome(outcome.value, outcome.error, value if outcome.ok else None)
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        return Outcome(None, f"TypeError: reward returned {type(value).__name__}, expected a float")
    ok = math.isfinite(number := float(value))
    return Outcome(number) if ok else Outcome(None, f"ValueError: reward returned {number}")


def _init_worker(memory_limit_mb: int | None, preload: tuple[str, ...], path: list[str]) -> None:
    sys.path[:0] = path  # to unpickle what the parent can
    for module in preload:
        importlib.import_module(module)
    if memory_limit_mb is not None and os.path.exists("/proc/self/statm"):  # (Linux)
        with open("/proc/self/statm") as statm:  # its size now, in pages
            soft = int(statm.read().split()[0]) * resource.getpagesize() + memory_limit_mb * 2**20
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def _run_in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except MemoryError:
        os._exit(_MEMORY_EXIT)  # its leaked memory may still be held: pebble replaces us
    except BaseException as e:  # noqa: BLE001
        raise GuardError(describe_error(e)) from None


class RewardGuard:
    """Runs callables with a timeout and exception capture; see the module docstring."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        backend: Literal["thread", "process"] = "thread",
        max_workers: int = 4,
        max_hung: int = 16,
        max_queue_wait_s: float = 60.0,
        memory_limit_mb: int | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        if backend not in ("thread", "process"):
            raise ValueError(f"backend must be 'thread' or 'process', got {backend!r}")
        if min(timeout_s, max_queue_wait_s, max_workers) <= 0 or max_hung < 0:
            raise ValueError("need timeout_s, max_queue_wait_s, max_workers > 0, max_hung >= 0")
        for module in preload:  # fail here rather than in every worker
            importlib.import_module(module)
        self.timeout_s, self.backend, self.max_workers = float(timeout_s), backend, max_workers
        self.max_hung, self.max_wait, self.memory_mb = max_hung, max_queue_wait_s, memory_limit_mb
        self.preload, self.calls, self.failures, self.timeouts = tuple(preload), 0, 0, 0
        self.healthy = self.hung = 0  # (thread) workers not hung (until close); hung ones
        self._lock, self._closed, self._pool = threading.Condition(), False, None
        self._queue, self._running = queue.SimpleQueue(), []  # running: by deadline (fixed timeout)
        self._ctx = mp.get_context("forkserver")  # a worker (re)start forks a server that
        self._ctx.set_forkserver_preload(
            ["streamrl.core.types", "streamrl.rollout.rewards"]
        )  # has torch
        if backend == "thread":
            threading.Thread(target=self._watch, name="reward-watchdog", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start ``fn(*args)``; pass the future to :meth:`outcome` / :meth:`aoutcome`."""
        if pool := self.start():
            return pool.schedule(_run_in_worker, (fn, *args), timeout=self.timeout_s)
        future: Future = Future()
        with self._lock:
            self._queue.put((future, fn, args))
            self._rebalance()
        return future

    def outcome(self, future: Future, wait: float | None = None, *, group: bool = False) -> Outcome:
        """Wait (bounded) for a submitted call and turn it into an :class:`Outcome`
        (``group``: the call returned a group reward's checked list of values)."""
        convert = _as_values if group else _to_outcome
        try:
            error = future.exception(self.max_wait + self.timeout_s if wait is None else wait)
            result = Outcome(None, self._describe(error)) if error else convert(future.result())
        except FutureTimeout:
            future.cancel()  # it never started: make sure it never will (pebble kills it)
            result = Outcome(None, f"timeout: no reward worker free within {self.max_wait:.1f}s")
        except CancelledError:
            result = Outcome(None, "cancelled")
        with self._lock:
            self.calls, self.failures = self.calls + 1, self.failures + (not result.ok)
            self.timeouts += (result.error or "").startswith("timeout")
        return result

    async def aoutcome(self, future: Future, *, group: bool = False) -> Outcome:
        """:meth:`outcome` for asyncio code: awaits without blocking the event loop."""
        wrapped = asyncio.wrap_future(future)
        wrapped.add_done_callback(lambda f: f.cancelled() or f.exception())  # (retrieved)
        await asyncio.wait({wrapped}, timeout=self.max_wait + self.timeout_s)
        return self.outcome(future, wait=0, group=group)  # done, or waited too long

    def call(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        """Run ``fn(*args)`` guarded; never raises for the function's failures."""
        return self.outcome(self.submit(fn, *args))

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        return await self.aoutcome(self.submit(fn, *args))

    def stats(self) -> dict[str, int]:
        """Counters for metrics: calls, failures, timeouts, currently hung workers."""
        counts = {"calls": self.calls, "failures": self.failures, "timeouts": self.timeouts}
        return {**counts, "hung_workers": self.hung}

    def start(self) -> pebble.ProcessPool | None:
        """Start the worker processes ahead of the first call (no-op for threads)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardGuard is closed")
            while self.backend == "process" and not (self._pool and self._pool.active):
                if self._pool:  # it broke (pebble gives up when an idle worker dies): replace it
                    self._pool.stop()
                    threading.Thread(target=self._pool.join, daemon=True).start()
                init = (self.memory_mb, self.preload, list(sys.path))
                self._pool = pebble.ProcessPool(self.max_workers, 0, _init_worker, init, self._ctx)
            return self._pool  # (reading .active started it)

    def close(self) -> None:
        """Stop the workers (hung threads are daemons and die with the process)."""
        with self._lock:
            self._closed, pool, self._pool = True, self._pool, None
            self._lock.notify_all()
            for _ in range(self.healthy):
                self._queue.put(None)
        if pool is not None:
            pool.stop()
            pool.join()

    def __enter__(self) -> RewardGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _describe(self, error: BaseException) -> str:
        if isinstance(error, FutureTimeout) and self.backend == "process":  # pebble's
            return f"timeout after {self.timeout_s}s"
        if not isinstance(error, pebble.ProcessExpired):  # (a worker died)
            return describe_error(error)  # BrokenProcessPool too: start() replaces the pool
        if (code := error.exitcode or 0) == _MEMORY_EXIT:
            return f"MemoryError: reward went past the worker memory limit ({self.memory_mb} MB)"
        return f"reward worker died ({signal.Signals(-code).name if code < 0 else code})"

    def _rebalance(self) -> None:  # (thread) the caller holds the lock
        cap = self.max_workers - max(0, self.hung - self.max_hung)  # the pool shrinks past it
        while self.healthy < cap and not self._closed:
            self.healthy += 1
            threading.Thread(target=self._work, name="reward-worker", daemon=True).start()
        while not self.healthy and not self._queue.empty():  # nobody will ever take these
            if (future := self._queue.get_nowait()[0]).set_running_or_notify_cancel():
                future.set_exception(GuardError(f"no reward worker available: {self.hung} hung"))

    def _work(self) -> None:
        for future, fn, args in iter(self._queue.get, None):
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running.append(entry := (time.monotonic() + self.timeout_s, future))
                if len(self._running) == 1:  # else the watchdog wakes before this deadline
                    self._lock.notify()
            try:
                value, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - any failure is the reward's failure
                value, error = None, e
            with self._lock:
                if future.done():  # failed at its deadline: this thread was replaced
                    self.hung -= 1
                    return self._rebalance()  # (if the pool had shrunk)
                self._running.remove(entry)
                future.set_result(value) if error is None else future.set_exception(error)

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                while self._running and self._running[0][0] <= time.monotonic():
                    _, future = self._running.pop(0)
                    future.set_exception(GuardError(f"timeout after {self.timeout_s}s"))
                    self.healthy, self.hung = self.healthy - 1, self.hung + 1
                    self._rebalance()
                self._lock.wait(self._running[0][0] - time.monotonic() if self._running else None)

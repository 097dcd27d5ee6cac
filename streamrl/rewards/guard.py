"""Run reward functions so that one that raises or hangs is a recorded failure.

``RewardGuard.call(fn, completion, item)`` (or ``await guard.acall(...)``) always
returns an :class:`Outcome` within about ``timeout_s`` of the function starting:
either its value, or an error text such as ``"timeout after 2.0s"`` or
``"ValueError: bad answer (functions.py:42 in numeric_match)"``. The caller is never
stopped or stalled by the reward.

Design. A hung Python function cannot be killed from another thread, so isolation
means: run it somewhere else, stop waiting at the deadline, and make sure the
stuck worker costs nothing more than itself. Two backends:

``backend="thread"`` (default). A small pool of daemon worker threads fed from a
queue, plus one watchdog thread holding the deadlines of running calls. At the
deadline the watchdog fails the call's future ("timeout after ...s"), marks the
worker abandoned and starts a replacement, so capacity is kept. The abandoned
thread exits when (if ever) its function returns. At most ``max_hung`` abandoned
threads are replaced; past that the pool shrinks and, once no healthy worker is
left, calls fail at once ("no reward worker available") instead of queueing, so
threads never grow without bound and nothing ever blocks. Overhead is one thread
hop each way (~0.1-0.2 ms, like a ThreadPoolExecutor round trip), closures and stateful callables work unchanged, and
nothing is pickled: the right default for our own rewards (exact/numeric match,
math-verify, reasoning-gym scorers), which are pure Python and so yield the GIL.
Limits: an abandoned thread keeps its CPU until it returns, and C code that holds
the GIL (a catastrophic regex, a huge ``10**10**9``) freezes the whole process,
which no thread-based timeout can prevent.

``backend="process"`` (hard isolation). Worker processes (``forkserver`` start
method, else ``spawn``; never ``fork``, which is unsafe in a process with threads).
Each worker is driven by one parent-side thread that sends a call, waits for the
reply until the deadline, and on a timeout kills the process (SIGKILL) and starts
a fresh one. Use it for untrusted or GIL-holding reward code, or code that may
crash the interpreter. Costs: functions and items are pickled (~0.1-1 ms per
call) and must be importable module-level callables (or partials of them); the
fork server imports ``streamrl.types`` (hence torch) once, after which a worker
(re)start is a fork; heavy reward dependencies go in ``preload`` so that they are
imported before a worker takes calls, not inside a timed call.

Waiting for a free worker is not charged to ``timeout_s``; it is capped separately
by ``max_queue_wait_s`` so a caller is never stuck even when all workers are busy.
From asyncio use ``await guard.acall(...)``: it awaits the call's future without
blocking the event loop or occupying a thread.
"""

from __future__ import annotations

import asyncio
import heapq
import importlib
import importlib.util
import itertools
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """The result of one guarded call: ``value`` (a finite float) or ``error`` (text)."""

    value: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class GuardError(Exception):
    """A failure produced by the guard itself (timeout, dead worker, remote error).

    Its text is the complete error description; no exception type is prepended.
    """


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
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" ({os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text


def _to_outcome(value: Any) -> Outcome:
    """Check a reward's return value: a real, finite number."""
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        return Outcome(None, f"TypeError: reward returned {type(value).__name__}, expected a float")
    number = float(value)
    if not math.isfinite(number):
        return Outcome(None, f"ValueError: reward returned {number}")
    return Outcome(number)


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future = field(default_factory=Future)
    done: bool = False
    abandoned: bool = False


def _resolve(job: _Job, value: Any = None, error: BaseException | None = None) -> None:
    """Set a job's future unless it was already failed (timed out) or cancelled."""
    try:
        if error is None:
            job.future.set_result(value)
        else:
            job.future.set_exception(error)
    except Exception:  # InvalidStateError: the watchdog or a cancel got there first
        pass


class _ThreadBackend:
    """Worker threads + a watchdog that fails and replaces calls past their deadline."""

    def __init__(self, timeout_s: float, max_workers: int, max_hung: int) -> None:
        self.timeout_s, self.max_workers, self.max_hung = timeout_s, max_workers, max_hung
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._deadlines: list[tuple[float, int, _Job]] = []  # heap of running calls
        self._seq = itertools.count()
        self.healthy = 0  # live workers that are not hung
        self.idle = 0
        self.hung = 0  # abandoned workers still running a call
        self._watchdog: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future:
        job = _Job(fn, args)
        with self._cond:
            if self._closed:
                raise RuntimeError("RewardGuard is closed")
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="reward-watchdog", daemon=True
                )
                self._watchdog.start()
            if self.idle == 0 and self.healthy < self.max_workers:
                if self._can_start():
                    self._start_worker()
                elif self.healthy == 0:  # every thread we may have is hung: fail, don't queue
                    _resolve(job, error=GuardError(self._no_worker_text()))
                    return job.future
        self._queue.put(job)
        return job.future

    def _no_worker_text(self) -> str:
        return f"no reward worker available: {self.hung} workers hung past the timeout"

    def _can_start(self) -> bool:  # caller holds the lock
        return self.healthy + self.hung < self.max_workers + self.max_hung

    def _start_worker(self) -> None:  # caller holds the lock
        self.healthy += 1
        threading.Thread(target=self._work, name="reward-worker", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self.idle += 1
            job = self._queue.get()
            with self._cond:
                self.idle -= 1
                if job is None:
                    self.healthy -= 1
                    return
                if not job.future.set_running_or_notify_cancel():
                    continue
                # Deadlines only grow (constant timeout), so the watchdog, asleep until
                # the earliest one, needs waking only when it has nothing to watch.
                if not self._deadlines:
                    self._cond.notify()
                deadline = time.monotonic() + self.timeout_s
                heapq.heappush(self._deadlines, (deadline, next(self._seq), job))
            try:
                value, error = job.fn(*job.args), None
            except BaseException as e:  # noqa: BLE001 - any failure is the reward's failure
                value, error = None, e
            with self._cond:
                job.done = True
                job.args = ()  # the heap keeps the job until its deadline; free the inputs
                if job.abandoned:  # timed out; a replacement is already running
                    self.hung -= 1
                    return
            _resolve(job, value, error)

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._deadlines and (
                    self._deadlines[0][2].done or self._deadlines[0][0] <= now
                ):
                    _, _, job = heapq.heappop(self._deadlines)
                    if not job.done:
                        self._abandon(job)
                wait = self._deadlines[0][0] - now if self._deadlines else None
                self._cond.wait(wait)

    def _abandon(self, job: _Job) -> None:  # caller holds the lock
        job.abandoned = True
        self.healthy -= 1
        self.hung += 1
        _resolve(job, error=GuardError(f"timeout after {float(self.timeout_s)}s"))
        if self._can_start():
            self._start_worker()
        else:
            logger.warning("reward guard: %d hung reward workers; not replacing", self.hung)
            if self.healthy == 0:  # nobody will ever take the queued calls: fail them now
                while True:
                    try:
                        queued = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if queued is not None:
                        _resolve(queued, error=GuardError(self._no_worker_text()))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            workers = self.healthy
            self._cond.notify_all()
        for _ in range(workers):
            self._queue.put(None)


def _process_worker(conn: Any, preload: tuple[str, ...]) -> None:
    """Worker process main loop: run ``(fn, args)`` messages, reply ``(ok, value|error)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    import streamrl.types  # noqa: F401 - so unpickling an Item is not charged to a call

    for module in preload:  # heavy imports happen before the worker is ready, not in a call
        importlib.import_module(module)

    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        except BaseException as e:  # noqa: BLE001 - e.g. the function is not importable here
            conn.send((False, describe_error(e)))
            continue
        if message is None:
            return
        fn, args = message
        try:
            reply = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001
            reply = (False, describe_error(e))
        try:
            conn.send(reply)
        except Exception as e:  # the value does not pickle
            conn.send((False, describe_error(e)))


class _ProcessBackend:
    """Worker processes, one parent-side driver thread each; a timeout kills the process."""

    def __init__(
        self,
        timeout_s: float,
        max_workers: int,
        preload: tuple[str, ...] = (),
        start_timeout_s: float = 300.0,
    ) -> None:
        self.preload = preload
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self.start_timeout_s = start_timeout_s
        if "forkserver" in mp.get_all_start_methods():
            self._ctx = mp.get_context("forkserver")
            # The fork server imports these once, so a worker (re)start is a cheap fork
            # instead of a fresh torch import. Only takes effect if the server has not
            # started yet; harmless for other users of the server.
            self._ctx.set_forkserver_preload(["streamrl.types", "streamrl.rewards"])
        else:
            self._ctx = mp.get_context("spawn")
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._drivers: list[threading.Thread] = []
        self._closed = False
        self.restarts = 0
        self.hung = 0  # always 0: hung workers are killed

    def start(self) -> None:
        """Start the workers now (otherwise on the first call)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardGuard is closed")
            while len(self._drivers) < self.max_workers:
                t = threading.Thread(target=self._drive, name="reward-process-driver", daemon=True)
                t.start()
                self._drivers.append(t)

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future:
        self.start()
        job = _Job(fn, args)
        self._queue.put(job)
        return job.future

    def _spawn(self) -> tuple[Any, Any]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_process_worker, args=(child, self.preload), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(self.start_timeout_s):
            proc.kill()
            raise RuntimeError(f"reward worker did not start within {self.start_timeout_s}s")
        parent.recv()  # "ready"
        return proc, parent

    def _drive(self) -> None:
        proc = conn = None
        while not self._closed:
            if proc is None:
                try:
                    proc, conn = self._spawn()
                except Exception:
                    logger.exception("reward guard: cannot start a reward worker process")
                    time.sleep(1.0)
                    continue
            job = self._queue.get()
            if job is None:
                break
            if not job.future.set_running_or_notify_cancel():
                continue
            error = self._run(proc, conn, job)
            if error is None:
                continue
            _resolve(job, error=error)
            proc.kill()
            proc.join(5.0)
            conn.close()
            proc = conn = None
            self.restarts += 1
        if proc is not None:
            conn.send(None)
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()

    def _run(self, proc: Any, conn: Any, job: _Job) -> GuardError | None:
        """Run one job on a worker; a returned error means the worker must be replaced."""
        try:
            conn.send((job.fn, job.args))
            if not conn.poll(self.timeout_s):
                return GuardError(f"timeout after {float(self.timeout_s)}s")
            ok, payload = conn.recv()
        except (EOFError, OSError):
            proc.join(1.0)
            return GuardError(f"reward worker process died (exit code {proc.exitcode})")
        except Exception as e:  # the function or its arguments do not pickle
            _resolve(job, error=e)
            return None
        _resolve(job, payload if ok else None, None if ok else GuardError(payload))
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            drivers = len(self._drivers)
        for _ in range(drivers):
            self._queue.put(None)


class RewardGuard:
    """Runs callables with a timeout and exception capture; see the module docstring.

    Args:
        timeout_s: a call running longer than this fails with ``"timeout after ...s"``.
        backend: ``"thread"`` (fast, default) or ``"process"`` (hard isolation).
        max_workers: concurrent calls.
        max_hung: (thread backend) hung workers replaced before the pool shrinks.
        max_queue_wait_s: how long a call may wait for a free worker before failing.
        preload: (process backend) modules each worker imports before taking calls,
            e.g. ``("math_verify", "reasoning_gym")``: an import inside a call counts
            toward ``timeout_s``, and a worker killed for it would import it again.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        backend: Literal["thread", "process"] = "thread",
        max_workers: int = 4,
        max_hung: int = 16,
        max_queue_wait_s: float = 60.0,
        preload: tuple[str, ...] = (),
    ) -> None:
        if timeout_s <= 0 or max_workers < 1 or max_hung < 0 or max_queue_wait_s <= 0:
            raise ValueError(
                "need timeout_s > 0, max_workers >= 1, max_hung >= 0, max_queue_wait_s > 0"
            )
        self.timeout_s, self.max_queue_wait_s = timeout_s, max_queue_wait_s
        if backend == "thread":
            self._backend: _ThreadBackend | _ProcessBackend = _ThreadBackend(
                timeout_s, max_workers, max_hung
            )
        elif backend == "process":
            missing = [m for m in preload if importlib.util.find_spec(m) is None]
            if missing:
                raise ValueError(f"preload: cannot find module(s) {', '.join(missing)}")
            self._backend = _ProcessBackend(timeout_s, max_workers, tuple(preload))
        else:
            raise ValueError(f"backend must be 'thread' or 'process', got {backend!r}")
        self.backend = backend
        self.calls = self.failures = self.timeouts = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start ``fn(*args)``; pass the future to :meth:`outcome` / :meth:`aoutcome`."""
        return self._backend.submit(fn, args)

    def outcome(self, future: Future) -> Outcome:
        """Wait (bounded) for a submitted call and turn it into an :class:`Outcome`."""
        try:
            value = future.result(timeout=self.max_queue_wait_s + self.timeout_s)
        except FutureTimeout:
            return self._record(self._queue_timeout(future))
        except CancelledError:
            return self._record(Outcome(None, "cancelled"))
        except BaseException as e:  # noqa: BLE001
            return self._record(Outcome(None, describe_error(e)))
        return self._record(_to_outcome(value))

    async def aoutcome(self, future: Future) -> Outcome:
        """:meth:`outcome` for asyncio code: awaits without blocking the event loop."""
        wrapped = asyncio.wrap_future(future)
        done, _ = await asyncio.wait({wrapped}, timeout=self.max_queue_wait_s + self.timeout_s)
        if not done:
            wrapped.cancel()
            return self._record(self._queue_timeout(future))
        if not wrapped.cancelled():
            wrapped.exception()  # mark it retrieved: the outcome below reports it
        return self.outcome(future)  # already resolved: returns at once

    def call(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        """Run ``fn(*args)`` guarded; never raises for the function's failures."""
        return self.outcome(self.submit(fn, *args))

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        """Async :meth:`call`."""
        return await self.aoutcome(self.submit(fn, *args))

    def _queue_timeout(self, future: Future) -> Outcome:
        future.cancel()  # it never started: make sure it never will
        return Outcome(
            None, f"timeout: no reward worker free within {float(self.max_queue_wait_s)}s"
        )

    def _record(self, outcome: Outcome) -> Outcome:
        with self._lock:
            self.calls += 1
            if outcome.error is not None:
                self.failures += 1
                self.timeouts += outcome.error.startswith("timeout")
        return outcome

    def stats(self) -> dict[str, int]:
        """Counters for metrics: calls, failures, timeouts, currently hung workers."""
        return {
            "calls": self.calls,
            "failures": self.failures,
            "timeouts": self.timeouts,
            "hung_workers": self._backend.hung,
        }

    def start(self) -> None:
        """Start worker processes ahead of the first call (process backend; no-op otherwise)."""
        if isinstance(self._backend, _ProcessBackend):
            self._backend.start()

    def close(self) -> None:
        """Stop the workers (hung threads are daemons and die with the process)."""
        self._backend.close()

    def __enter__(self) -> RewardGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

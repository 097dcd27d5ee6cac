"""The local placement's supervisor: with ``train.world_size > 1`` on ``train.placement:
local``, the ``streamrl train`` process holds no model and no process group. It runs
rank 0 (the controller, which spawns ranks 1..N-1) in a child process (spawn), as
torchrun's agent does, and restarts it from the latest checkpoint when it is lost: killed
(any signal, the OOM killer), exited without a result, or hung (a ping unanswered for
``train.collective_timeout_s``, the rule of :mod:`streamrl.run.pings`). A rank group
failure the child reports itself (a follower died or hung) restarts it the same way, and
both count against one ``runtime.max_trainer_restarts``.

The child's result comes back over a pipe, and so does its exception, unchanged (a
user's error stays one line, an interrupted run keeps its exit code). SIGINT/SIGTERM are
the supervisor's: the child ignores them (a Ctrl-C reaches the whole process group) and
is asked to stop over the pipe, once. The child and its followers end with the
supervisor. This module imports little, so the child starts fast."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.core.parent import exit_with_parent, ignore_stop_signals
from streamrl.run.signals import GracefulStop
from streamrl.run.tracking import note

if TYPE_CHECKING:
    from streamrl.run.pings import Pings

POLL_S = 0.2
START_TIMEOUT_S = 180.0  # for the child to start (import torch and the run's modules)
EXIT_GRACE_S = 30.0  # for a child that has sent its result to exit
FOLLOWER_GRACE_S = 3.0  # for a lost child's followers to notice and exit by themselves


class TrainerFailed(RuntimeError):
    """The trainer failed more often than ``runtime.max_trainer_restarts`` allows."""


class ChildLost(RuntimeError):
    """Rank 0's process ended without a result, or hung; the message names the cause."""


def restart(limit: int, restarts: list[str], run_dir: Path, why: str) -> None:
    """Count a restart in ``restarts`` (their causes), or fail the run when there have
    been ``limit`` already."""
    if len(restarts) >= limit:
        raise TrainerFailed(
            f"the trainer's rank group failed {len(restarts) + 1} times "
            f"(runtime.max_trainer_restarts={limit}); last cause: {why}"
        ) from None
    restarts.append(why)
    note(
        None,
        f"the trainer's rank group failed ({why}); restarting it from the latest checkpoint "
        f"in {run_dir} ({len(restarts)}/{limit})",
    )


def supervise(
    target: Callable[..., Any],
    args: tuple,
    *,
    resume: bool,
    restarts: list[str],
    limit: int,
    run_dir: Path,
    stop: GracefulStop,
    progress: Callable[..., None] | None,
    timeout_s: float,
    retry: tuple[type[BaseException], ...] = (),
) -> Any:
    """``target(*args, resume, restarts, stop=, progress=)``'s result, run in a child;
    the child lost, or raising one of ``retry``, is restarted with ``resume=True`` and the
    causes so far (``restarts``, appended to here) up to ``limit`` times."""
    while True:
        try:
            return run_attempt(
                target, (*args, resume, list(restarts)), stop, progress, timeout_s, run_dir
            )
        except (ChildLost, *retry) as e:
            restart(limit, restarts, run_dir, str(e))
            resume = True


def run_attempt(
    target: Callable[..., Any],
    args: tuple,
    stop: GracefulStop,
    progress: Callable[..., None] | None,
    timeout_s: float,
    run_dir: Path,
) -> Any:
    """One child: its result, or its exception re-raised, or :class:`ChildLost` (the
    child and the followers it listed in ``run_dir/ranks.pid`` are killed)."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    forward = progress is not None
    proc = ctx.Process(
        target=_child, args=(theirs, target, args, os.getpid(), forward), name="streamrl-rank0"
    )
    proc.start()
    theirs.close()
    try:
        return _Watch(proc, ours, timeout_s).until_done(stop, progress)
    except ChildLost:
        _end(proc, grace_s=0)
        kill_followers(run_dir / "ranks.pid", proc.pid)
        raise
    finally:
        _end(proc, grace_s=EXIT_GRACE_S)
        ours.close()


class _Watch:
    """The supervisor's side of the pipe: messages, pings, and the child's death."""

    def __init__(self, proc: Any, conn: Any, timeout_s: float) -> None:
        self.proc, self.conn, self.timeout_s = proc, conn, timeout_s
        self.asked = self.answered = 0
        self.pings: Pings | None = None  # from the child's first word on (it imports first)
        self.started = time.monotonic()

    def _ping(self) -> list[int]:
        self.asked += 1
        self._send(("ping", self.asked))
        return [self.asked]

    def _unanswered(self, handles: list[int]) -> list[int]:
        return [0] if self.answered < handles[0] else []

    def _send(self, message: tuple) -> None:
        with contextlib.suppress(OSError):  # a dead child: its end of the pipe says so next
            self.conn.send(message)

    def until_done(self, stop: GracefulStop, progress: Callable[..., None] | None) -> Any:
        """The child's result, or its exception raised, or :class:`ChildLost`."""
        forwarded = False
        while True:
            if self.conn.poll(POLL_S):
                done, value = self._take(progress)
                if done:
                    return value
            elif not self.proc.is_alive() and not self.conn.poll(0):
                raise ChildLost(self._death())
            self._check_pings()
            if stop.requested and not forwarded:
                self._send(("stop", stop.signum))
                forwarded = True

    def _take(self, progress: Callable[..., None] | None) -> tuple[bool, Any]:
        """Read one message: (True, the result), or raise the child's exception."""
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            raise ChildLost(self._death()) from None
        if kind == "result":
            return True, value
        if kind == "error":
            raise value
        if kind == "ready":
            from streamrl.run.pings import Pings  # here: the child does not import it

            self.pings = Pings(self._ping, self._unanswered, self.timeout_s)
        elif kind == "pong":
            self.answered = value
        elif kind == "progress" and progress is not None:
            progress(*value)
        return False, None

    def _check_pings(self) -> None:
        if self.pings is None:
            if time.monotonic() - self.started > START_TIMEOUT_S:
                raise ChildLost(
                    f"rank 0 (pid {self.proc.pid}) did not start in {START_TIMEOUT_S:.0f}s"
                )
            return
        try:
            self.pings.check()
        except RuntimeError as e:
            raise ChildLost(
                str(e).replace("rank(s) [0]", f"rank 0 (pid {self.proc.pid})")
            ) from None

    def _death(self) -> str:
        self.proc.join(5.0)
        code, pid = self.proc.exitcode, self.proc.pid
        if code is None:
            return f"rank 0 (pid {pid}) closed its pipe without a result"
        if code < 0:
            return f"rank 0 (pid {pid}) was killed by {signal.Signals(-code).name}"
        return f"rank 0 (pid {pid}) exited with code {code} without a result"


def _end(proc: Any, grace_s: float) -> None:
    """Wait up to ``grace_s`` for the child to exit, then kill it (a stopped one too)."""
    proc.join(grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join(10.0)


def kill_followers(pids_file: Path, child: int) -> None:
    """SIGKILL the followers a lost child listed (``rank pid`` lines; rank 0 is the
    child) that have not exited by themselves within :data:`FOLLOWER_GRACE_S`."""
    try:
        lines = pids_file.read_text().splitlines()
    except OSError:
        return
    ranks = dict(line.split() for line in lines if len(line.split()) == 2)
    if ranks.get("0") != str(child):  # written by an earlier child: its followers are gone
        return
    followers = [int(pid) for rank, pid in ranks.items() if rank != "0"]
    deadline = time.monotonic() + FOLLOWER_GRACE_S
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in followers):
        time.sleep(0.1)
    for pid in followers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _child(conn: Any, target: Callable[..., Any], args: tuple, parent: int, forward: bool) -> None:
    """Rank 0's process: run ``target``, answer pings, take a stop request, and send the
    result or the exception back."""
    exit_with_parent(parent)
    ignore_stop_signals()
    stop, lock = GracefulStop(), threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    threading.Thread(target=_listen, args=(conn, send, stop), daemon=True).start()
    send(("ready", None))
    progress = (lambda *update: send(("progress", update))) if forward else None
    try:
        value = target(*args, stop=stop, progress=progress)
    except BaseException as e:
        send(("error", portable(e)))
    else:
        send(("result", value))


def _listen(conn: Any, send: Callable[[tuple], None], stop: GracefulStop) -> None:
    while True:
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            stop.request(value)
        elif kind == "ping":
            send(("pong", value))


def portable(error: BaseException) -> BaseException:
    """``error`` as the supervisor will re-raise it, with the child's traceback as a note
    (shown only where a traceback is): the exception itself, or, if it cannot cross a pipe
    (its constructor takes other arguments than its message), its nearest base class that
    can, with the same message, so a user's error stays one (a ValueError, a ConfigError)."""
    where = "".join(traceback.format_exception(error)).rstrip()
    for cls in type(error).__mro__:
        if not issubclass(cls, BaseException):
            continue
        try:
            candidate = error if cls is type(error) else cls(str(error))
            pickle.loads(pickle.dumps(candidate))
        except Exception:
            continue
        note = f"raised in rank 0's process (pid {os.getpid()}):\n{where}"
        candidate.__notes__ = [*getattr(candidate, "__notes__", []), note]  # add_note: 3.11+
        return candidate
    raise AssertionError("unreachable: BaseException(str) crosses a pipe")

"""``process`` backend: each rollout worker is a subprocess with its own cores.

Commands go down one pipe per worker and reports come back up another, their tensors
pickled as plain arrays (:mod:`streamrl.stream.backends.wire`), not as shared-memory handles. The
parent closes its copies of the child's pipe ends, so a worker killed mid-message
shows up as end-of-file (never as a read that blocks forever), and a message is
either received whole or not at all. Weights travel through shared memory
(:mod:`streamrl.stream.backends.shared_weights`), never by pickling the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as tmp

from streamrl.core.messages import Command, Report, Stop, WorkerCrashed
from streamrl.stream.backends.base import Backend, WorkerLost
from streamrl.stream.backends.placement import apply
from streamrl.stream.backends.shared_weights import SharedWeights, SharedWeightsReader
from streamrl.stream.backends.spec import WorkerSpec
from streamrl.stream.backends.wire import dumps


def _sender(conn: Any) -> Callable[[Command | Report], None]:
    return lambda message: conn.send_bytes(dumps(message))


def _worker_main(
    spec: WorkerSpec, cmd_r: Any, rep_w: Any, shared: SharedWeights, cpus: Any, threads: int
) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    send = _sender(rep_w)
    try:
        apply(cpus, threads)
        engine, worker = spec.build(send)
        reader = SharedWeightsReader(shared, engine)
        reader.tick()  # the current weights before reporting ready

        def forward_commands() -> None:
            while True:
                try:
                    cmd = cmd_r.recv()
                except (EOFError, OSError):  # the trainer is gone
                    cmd = Stop()
                worker.inbox.put(cmd)
                if isinstance(cmd, Stop):
                    return

        threading.Thread(target=forward_commands, daemon=True).start()
        asyncio.run(worker.run(on_tick=reader.tick))
    except BaseException:
        try:
            send(WorkerCrashed(traceback.format_exc()))
        finally:
            os._exit(1)


class ProcessBackend(Backend):
    name = "process"
    restartable = True

    def __init__(
        self,
        spec: WorkerSpec,
        num_workers: int,
        initial_weights: dict[str, torch.Tensor],
        *,
        worker_cpus: tuple[tuple[int, ...] | None, ...],
        threads: int,
        version: int = 0,
    ) -> None:
        self.spec, self.num_workers = spec, num_workers
        self.worker_cpus, self.threads = worker_cpus, threads
        self._ctx = tmp.get_context("spawn")
        self.shared = SharedWeights(initial_weights, version, self._ctx)
        self._procs: list[Any] = [None] * num_workers
        self._cmd: list[Any] = [None] * num_workers
        self._rep: list[Any] = [None] * num_workers
        self._why: dict[int, str] = {}
        self._send_lock = threading.Lock()

    def start(self) -> None:
        for w in range(self.num_workers):
            self._spawn(w)

    def _spawn(self, w: int) -> None:
        cmd_r, cmd_w = self._ctx.Pipe(duplex=False)
        rep_r, rep_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.spec, cmd_r, rep_w, self.shared, self.worker_cpus[w], self.threads),
            name=f"streamrl-rollout-{w}",
            daemon=True,
        )
        proc.start()
        cmd_r.close()  # only the child reads commands and writes reports
        rep_w.close()
        self._procs[w], self._cmd[w], self._rep[w] = proc, cmd_w, rep_r
        self._why.pop(w, None)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def send(self, worker: int, command: Command) -> None:
        if worker in self._why:
            raise WorkerLost(self._why[worker])
        try:
            with self._send_lock:  # the pump and the trainer thread both send
                self._cmd[worker].send_bytes(dumps(command))
        except (BrokenPipeError, EOFError, OSError) as e:
            self._why.setdefault(worker, f"command pipe broken: {e!r}")
            raise WorkerLost(self._why[worker]) from e

    def poll(self) -> list[tuple[int, Report]]:
        out = []
        for w, conn in enumerate(self._rep):
            if w in self._why:
                continue
            try:
                while conn.poll():
                    msg = conn.recv()
                    if isinstance(msg, WorkerCrashed):
                        self._why[w] = f"crashed:\n{msg.traceback}"
                        break
                    out.append((w, msg))
            except (EOFError, OSError):  # the child exited (or was killed mid-message)
                self._why[w] = self._exit_reason(w)
        return out

    def _exit_reason(self, w: int) -> str:
        proc = self._procs[w]
        proc.join(1.0)
        code = proc.exitcode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def dead(self) -> dict[int, str]:
        for w, proc in enumerate(self._procs):
            # a dead child's pipe reads as ready until poll() has taken its last
            # reports and hit end-of-file; only then is it declared dead
            if w not in self._why and not proc.is_alive() and not self._rep[w].poll():
                self._why[w] = self._exit_reason(w)
        return dict(self._why)

    def restart(self, worker: int) -> None:
        self._terminate(worker)
        self._spawn(worker)

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.shared.publish(state_dict, version)

    def _terminate(self, w: int) -> None:
        proc = self._procs[w]
        if proc is None:
            return
        for conn in (self._cmd[w], self._rep[w]):
            conn.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)

    def close(self) -> None:
        for w, proc in enumerate(self._procs):
            if proc is not None and proc.is_alive():
                proc.join(10)  # the pool sent Stop()
            self._terminate(w)
            self._procs[w] = None

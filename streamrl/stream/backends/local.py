"""``local`` backend: rollout workers are threads of the trainer's process.

Nothing is copied or pickled: a published state dict is staged in each engine, and
the worker's own thread loads it at its engine's next step boundary (or between
steps, when the engine is idle), so the trainer's thread does not pay for it.
``breakpoint()`` works anywhere. A worker thread that dies is a bug in this process,
so it is not restarted: the run fails with the worker's traceback.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from streamrl.core.messages import Command, Report, Stop
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.threads import set_thread_torch_threads
from streamrl.rollout.worker import Emit, RolloutWorker
from streamrl.stream.backends.base import Backend, drain


class LocalBackend(Backend):
    name = "local"
    restartable = False

    def __init__(
        self,
        make: Callable[[int, Emit], tuple[LocalEngine, RolloutWorker]],
        num_workers: int,
        threads: int | None = None,
    ):
        self.num_workers = num_workers
        self.threads = threads  # each worker thread's torch threads (None: left as it is)
        self._reports: queue.SimpleQueue[tuple[int, tuple]] = queue.SimpleQueue()
        self.engines: list[LocalEngine] = []
        self.workers: list[RolloutWorker] = []
        for w in range(num_workers):
            engine, worker = make(w, lambda msg, w=w: self._reports.put((w, msg)))
            self.engines.append(engine)
            self.workers.append(worker)
        self._threads: list[threading.Thread] = []
        self._errors: dict[int, str] = {}

    def start(self) -> None:
        for w, worker in enumerate(self.workers):
            t = threading.Thread(
                target=self._run, args=(w, worker), name=f"rollout-{w}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _run(self, w: int, worker: RolloutWorker) -> None:
        if self.threads is not None:  # its weight loads too, whatever the trainer set since
            set_thread_torch_threads(self.threads)
        try:
            asyncio.run(worker.run(on_tick=self.engines[w].apply_staged_weights))
        except BaseException:
            self._errors[w] = traceback.format_exc()

    def send(self, worker: int, command: Command) -> None:
        self.workers[worker].inbox.put(command)

    def poll(self) -> list[tuple[int, Report]]:
        return drain(self._reports)

    def dead(self) -> dict[int, str]:
        return {
            w: self._errors.get(w, "rollout thread exited")
            for w, t in enumerate(self._threads)
            if not t.is_alive()
        }

    def restart(self, worker: int) -> None:
        raise RuntimeError("the local backend does not restart worker threads")

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # staged only: each worker's thread loads them (at its engine's next step, or
        # between steps on its tick), never the trainer's thread
        for engine in self.engines:
            engine.stage_weights(state_dict, version)

    def drive(self, threads: int, until: Callable[[], bool]) -> bool:
        """Runs the engine's steps on the calling thread until ``until()`` is true or the
        engine runs out of work (:meth:`LocalEngine.drive`). Returns False, having run
        nothing, where driving does not apply: more than one engine (one thread cannot
        step several at once), an engine that cannot be driven (a Gymnasium policy's), or
        one whose steps are too cheap to be worth it (:meth:`LocalEngine.worth_driving`)."""
        return drive_engine(self.engines[0] if len(self.engines) == 1 else None, threads, until)

    def close(self) -> None:
        for w in self.workers:
            w.inbox.put(Stop())
        for t in self._threads:
            t.join(30)
        for e in self.engines:
            e.close()


@runtime_checkable
class Drivable(Protocol):
    """An engine whose steps the calling thread can run (:class:`LocalEngine`)."""

    def drive(self, threads: int, until: Callable[[], bool]) -> int: ...

    def worth_driving(self) -> bool: ...


def drive_engine(engine: object, threads: int, until: Callable[[], bool]) -> bool:
    """Runs ``engine``'s steps on the calling thread (:meth:`LocalEngine.drive`) where
    that applies: a :class:`Drivable` engine whose steps cost enough
    (:meth:`LocalEngine.worth_driving`). False, having run nothing, otherwise (None, a
    Gymnasium policy's engine, vLLM's)."""
    if not (isinstance(engine, Drivable) and engine.worth_driving()):
        return False
    engine.drive(threads, until)
    return True

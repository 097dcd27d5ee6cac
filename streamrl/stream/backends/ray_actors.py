"""``ray`` backend: rollout workers and the trainer are Ray actors.

``streamrl.run.launch`` starts a local Ray instance (``init_ray``, or joins
``runtime.ray_address``) and runs the whole controller inside a trainer actor; the
controller then creates
one rollout actor per worker. Weights are put in Ray's object store once per
version and every actor reads the same object. A rollout actor that dies
(SIGKILL, node loss) surfaces as ``RayActorError`` on its next poll and is
replaced by the pool. Ray is optional: ``pip install 'streamrl[ray]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import socket
import threading
import traceback
import warnings
from typing import Any

import torch

from streamrl.core.messages import Command, Report, WorkerCrashed
from streamrl.stream.backends.base import Backend, WorkerLost, drain
from streamrl.stream.backends.placement import apply
from streamrl.stream.backends.spec import WorkerSpec
from streamrl.stream.backends.wire import dumps, loads


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("runtime.backend=ray needs Ray: pip install 'streamrl[ray]'") from e
    return ray


def _to_object_store(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple[Any, str]]:
    """numpy views of the tensors: Ray stores numpy buffers out of band and actors map
    them read-only without a copy (pickled torch tensors would be copied twice).
    numpy has no bfloat16, so those travel as int16 bit patterns."""
    out = {}
    for k, t in state_dict.items():
        t = t.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        out[k] = ((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy(), dtype)
    return out


def _from_object_store(stored: dict[str, tuple[Any, str]]) -> dict[str, torch.Tensor]:
    out = {}
    with warnings.catch_warnings():  # read-only buffers: the engine only copies from them
        warnings.simplefilter("ignore", UserWarning)
        for k, (arr, dtype) in stored.items():
            t = torch.from_numpy(arr)
            out[k] = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return out


class _RolloutActor:
    """One rollout worker; its asyncio loop runs on a thread of the actor."""

    def __init__(self, spec: WorkerSpec, cpus: Any, threads: int, weights: dict, version: int):
        apply(cpus, threads)
        self._reports: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.engine, self.worker = spec.build(self._reports.put)
        self.engine.update_weights(_from_object_store(weights), version)
        self._staged = version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self.worker.run())
        except BaseException:
            self._reports.put(WorkerCrashed(traceback.format_exc()))

    def send(self, command: bytes) -> None:
        self.worker.inbox.put(loads(command))

    def poll(self) -> bytes:
        """The reports since the last call (:mod:`streamrl.stream.backends.wire`)."""
        return dumps(drain(self._reports))

    def update_weights(self, weights: dict, version: int) -> None:
        if version <= self._staged:  # never step back, whatever order calls arrive in
            return
        self._staged = version
        self.engine.update_weights(_from_object_store(weights), version)

    def pid(self) -> int:
        return os.getpid()


class RayBackend(Backend):
    name = "ray"
    restartable = True
    poll_interval_s = 0.01  # each poll is a remote call: ask less often than a pipe

    def __init__(
        self,
        spec: WorkerSpec,
        num_workers: int,
        initial_weights: dict[str, torch.Tensor],
        *,
        worker_cpus: tuple[tuple[int, ...] | None, ...],
        threads: int,
        num_cpus: float,
        num_gpus: float = 0.0,
        poll_timeout_s: float = 30.0,
        version: int = 0,
    ) -> None:
        ray = _ray()
        self.spec, self.num_workers = spec, num_workers
        self.worker_cpus, self.threads = worker_cpus, threads
        self.poll_timeout_s = poll_timeout_s
        self._cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)(_RolloutActor)
        self._weights = (ray.put(_to_object_store(initial_weights)), version)
        self.actors: list[Any] = [None] * num_workers
        self._why: dict[int, str] = {}
        self._polls: dict[int, Any] = {}  # worker -> its poll call in flight

    def start(self) -> None:
        for w in range(self.num_workers):
            self._spawn(w)

    def _spawn(self, w: int) -> None:
        ref, version = self._weights
        self.actors[w] = self._cls.remote(
            self.spec, self.worker_cpus[w], self.threads, ref, version
        )
        self._why.pop(w, None)

    def pids(self) -> list[int]:
        ray = _ray()
        return ray.get([a.pid.remote() for a in self.actors], timeout=self.poll_timeout_s)

    def send(self, worker: int, command: Command) -> None:
        if worker in self._why:
            raise WorkerLost(self._why[worker])
        self.actors[worker].send.remote(dumps(command))  # a failure shows up on the next poll

    def poll(self) -> list[tuple[int, Report]]:
        """Never blocks and never drops reports: each worker has at most one poll call
        in flight, and a call that has not returned yet is collected next time."""
        ray = _ray()
        for w in range(self.num_workers):
            if w not in self._why and w not in self._polls:
                self._polls[w] = self.actors[w].poll.remote()
        if not self._polls:
            return []
        ready, _ = ray.wait(list(self._polls.values()), num_returns=len(self._polls), timeout=0)
        ready_set = set(ready)
        out = []
        for w, ref in list(self._polls.items()):
            if ref not in ready_set:
                continue  # still running (or hung: the pool's heartbeat timeout decides)
            del self._polls[w]
            try:
                reports = loads(ray.get(ref))
            except ray.exceptions.ActorUnavailableError:
                continue  # transient: ask again
            except ray.exceptions.RayError as e:  # RayActorError, ActorDiedError, ...
                self._why[w] = f"Ray actor died: {type(e).__name__}: {str(e)[:200]}"
                continue
            for msg in reports:
                if isinstance(msg, WorkerCrashed):
                    self._why[w] = f"crashed:\n{msg.traceback}"
                    break
                out.append((w, msg))
        return out

    def dead(self) -> dict[int, str]:
        return dict(self._why)

    def restart(self, worker: int) -> None:
        self._kill(worker)
        self._polls.pop(worker, None)  # the dead actor's reports are gone with it
        self._spawn(worker)

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        ray = _ray()
        ref = ray.put(_to_object_store(state_dict))  # one copy, mapped by every actor
        self._weights = (ref, version)
        acks = [
            a.update_weights.remote(ref, version)
            for w, a in enumerate(self.actors)
            if w not in self._why
        ]
        # a dead or hung worker is noticed and replaced by the pool
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(acks, timeout=self.poll_timeout_s)

    def _kill(self, w: int) -> None:
        ray = _ray()
        if self.actors[w] is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actors[w], no_restart=True)

    def close(self) -> None:
        for w in range(self.num_workers):
            self._kill(w)
            self.actors[w] = None


def init_ray(address: str | None, min_cpus: float = 0) -> None:
    """Join ``address`` or start a local instance (no dashboard, no network). A local
    instance offers at least ``min_cpus`` logical CPU slots (the actors' requests, which
    may oversubscribe the cores: placement pins threads, Ray only schedules), so no actor
    waits forever for a slot."""
    ray = _ray()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address not in (None, "auto", "local"):
        probe_address(address)  # ray.init would retry an unreachable address for minutes
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True)
    if address is None:
        kwargs["num_cpus"] = max(4, os.cpu_count() or 1, math.ceil(min_cpus))
    try:
        # "local": a fresh instance even when another Ray cluster runs on this machine
        # (ray.init(address=None) would join the latest one, found under /tmp/ray)
        ray.init(address="local" if address is None else address, **kwargs)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        raise ConnectionError(
            f"could not join the Ray cluster at runtime.ray_address={address!r}: {e}"
        ) from e


# HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS is
# one) answers with a SETTINGS frame of its own at once.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, and clearly, unless a Ray (gRPC) server answers at ``HOST:PORT``:
    ``ray.init`` retries an unreachable or silent address for minutes."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"runtime.ray_address={address!r}: expected 'auto' or 'HOST:PORT'")
    hint = "is `ray start --head` running there? Leave ray_address unset for a local instance"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            conn.sendall(_H2_PREFACE)
            reply = conn.recv(9)
    except TimeoutError:
        raise ConnectionError(
            f"runtime.ray_address={address!r}: something accepted the connection but did not "
            f"answer within {timeout_s:.0f}s, as a Ray cluster would; {hint}"
        ) from None
    except OSError as e:
        raise ConnectionError(
            f"cannot reach the Ray cluster at runtime.ray_address={address!r} "
            f"({e.strerror or e}); {hint}"
        ) from None
    if len(reply) < 4 or reply[3] != 0x04:  # not an HTTP/2 SETTINGS frame
        raise ConnectionError(
            f"runtime.ray_address={address!r}: the server there does not speak Ray's protocol "
            f"(gRPC); {hint}"
        )

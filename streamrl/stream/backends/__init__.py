"""Backends: where rollout workers run. One config key, ``runtime.backend``, picks one.

=========  ==============================  ===============================
backend    workers                         weights travel through
=========  ==============================  ===============================
local      threads of the trainer process  a reference (no copy)
process    subprocesses (own cores)        shared memory
ray        Ray actors (trainer too)        Ray's object store
=========  ==============================  ===============================

The controller talks to every backend through :class:`RolloutPool`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from streamrl.config import RuntimeConfig
from streamrl.rollout.spec import RolloutSpec
from streamrl.stream.backends.base import Backend, WorkerLost
from streamrl.stream.backends.placement import Placement, plan_placement
from streamrl.stream.backends.spec import WorkerSpec, make_worker
from streamrl.stream.pool import RolloutPool, WorkersUnreachable

__all__ = [
    "Backend",
    "Placement",
    "RolloutPool",
    "WorkerLost",
    "WorkerSpec",
    "WorkersUnreachable",
    "make_backend",
    "make_worker",
    "plan_placement",
]


def make_backend(
    runtime: RuntimeConfig,
    spec: RolloutSpec,
    placement: Placement,
    engine_model: torch.nn.Module,
    tokenizer: Any,
    weights: dict[str, torch.Tensor],
    device: str,
    version: int = 0,
) -> Backend:
    """The backend ``runtime.backend`` names, its workers built from ``spec`` and loaded
    with ``weights`` as ``version`` (0 for a new run, the checkpoint's version after a
    resume)."""
    n = runtime.num_rollout_workers
    if runtime.backend == "local":
        from streamrl.engines.factory import make_inference_engine
        from streamrl.stream.backends.local import LocalBackend

        options = spec.engine_options

        def make(w: int, emit):
            model = engine_model if w == 0 else copy.deepcopy(engine_model)
            engine = make_inference_engine(model, tokenizer, device=device, **options)
            engine.update_weights(weights, version)
            return engine, make_worker(spec, engine, tokenizer, emit)

        return LocalBackend(make, n, threads=placement.worker_threads)
    worker = WorkerSpec(spec, engine_model.config, tokenizer, device)
    if runtime.backend == "process":
        from streamrl.stream.backends.process import ProcessBackend

        return ProcessBackend(
            worker,
            n,
            weights,
            worker_cpus=placement.worker_cpus,
            threads=placement.worker_threads,
            version=version,
        )
    from streamrl.stream.backends.ray_actors import RayBackend

    return RayBackend(
        worker,
        n,
        weights,
        worker_cpus=placement.worker_cpus,
        threads=placement.worker_threads,
        num_cpus=0 if placement.colocated else placement.worker_threads,
        num_gpus=runtime.num_gpus,
        poll_timeout_s=runtime.worker_timeout_s,
        version=version,
    )

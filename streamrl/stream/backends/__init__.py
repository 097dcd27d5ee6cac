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

from streamrl.config import Config
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
    cfg: Config,
    placement: Placement,
    engine_model: torch.nn.Module,
    tokenizer: Any,
    weights: dict[str, torch.Tensor],
    device: str,
    version: int = 0,
) -> Backend:
    """The configured backend, its workers loaded with ``weights`` as ``version``
    (0 for a new run, the checkpoint's version after a resume)."""
    n = cfg.runtime.num_rollout_workers
    if cfg.runtime.backend == "local":
        from streamrl.engines.factory import engine_options, make_inference_engine
        from streamrl.stream.backends.local import LocalBackend

        def make(w: int, emit):
            model = engine_model if w == 0 else copy.deepcopy(engine_model)
            engine = make_inference_engine(model, tokenizer, device=device, **engine_options(cfg))
            engine.update_weights(weights, version)
            return engine, make_worker(cfg, engine, tokenizer, emit)

        return LocalBackend(make, n, threads=placement.worker_threads)
    spec = WorkerSpec(cfg, engine_model.config, tokenizer, device)
    if cfg.runtime.backend == "process":
        from streamrl.stream.backends.process import ProcessBackend

        return ProcessBackend(
            spec,
            n,
            weights,
            worker_cpus=placement.worker_cpus,
            threads=placement.worker_threads,
            version=version,
        )
    from streamrl.stream.backends.ray_actors import RayBackend

    return RayBackend(
        spec,
        n,
        weights,
        worker_cpus=placement.worker_cpus,
        threads=placement.worker_threads,
        num_cpus=0 if placement.colocated else placement.worker_threads,
        num_gpus=cfg.runtime.num_gpus,
        poll_timeout_s=cfg.runtime.worker_timeout_s,
        version=version,
    )

"""The pool: what the controller drives, whoever produces the groups.

Two implementations, one interface (:class:`Pool`), one factory (:func:`make_pool`):
:class:`~streamrl.stream.pool.RolloutPool` hands the task source's items to rollout
workers on the configured backend; :class:`~streamrl.stream.endpoint.pool.EndpointPool`
(``streamrl serve``, ``endpoint.enabled``) admits the sessions of external agents. Both
put their groups into the same :class:`~streamrl.stream.sample_stream.SampleStream`, so
the stream, the staleness bound, the accounting, checkpoints and metrics do not depend
on which one runs, and neither does the controller.

Flow control, four words:

- ``admit(on)``: new items are admitted, or not; what was admitted goes on either way;
- ``pause_generation()`` / ``resume_generation()``: every engine stops between two decode
  steps, and resumes (the trainer takes the cores: colocated placement);
- ``work_ahead(on)``: whether idle workers may do work ahead of demand (score candidates
  for later batches); off while the trainer evaluates. A paused pool does none either;
- ``finish_inflight()``: wait until nothing admitted is being generated (with admission
  off): a rollout worker's items have all been reported; an endpoint's calls have
  returned (its sessions stay open: their agents decide when they end).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from streamrl.config import EndpointConfig, RuntimeConfig
from streamrl.core.messages import DroppedGroup
from streamrl.rollout.selection import GroupSampler, build_sampler
from streamrl.rollout.spec import RolloutSpec
from streamrl.sources.base import TaskSource
from streamrl.stream.backends import make_backend
from streamrl.stream.backends.placement import Placement
from streamrl.stream.pool import RolloutPool
from streamrl.stream.sample_stream import SampleStream


@runtime_checkable
class Pool(Protocol):
    """A producer of groups for the stream, as the controller sees it."""

    restarts: int  # rollout workers replaced
    reissued: int  # items issued again after a worker was lost
    resumed_items: int  # items issued again after a resume
    publish_s: dict[int, float]  # version -> seconds the trainer spent publishing it
    sync_latency: dict[int, float]  # version -> seconds until every engine ran it
    sampler: GroupSampler  # which items are issued: its counters (the plain one: none)

    # ---- lifecycle
    def start(self) -> None:
        """Start producing (workers, or the endpoint's server)."""

    def stop(self) -> None:
        """Stop producing and release everything (the stream is closed after)."""

    def wait_version(self, version: int, timeout: float | None = None) -> None:
        """Block until every engine runs weight version ``version`` (or newer)."""

    def raise_if_failed(self) -> None:
        """Raise the error that stopped the pool's own thread, if any."""

    # ---- flow control (the module docstring)
    def admit(self, on: bool) -> None: ...

    def pause_generation(self) -> None: ...

    def resume_generation(self) -> None: ...

    def work_ahead(self, on: bool) -> None: ...

    def finish_inflight(self) -> None: ...

    def drive_engines(self, threads: int, until: Callable[[], bool]) -> bool:
        """Run the engines' steps on the caller's thread until ``until()`` is true
        (``runtime.lend_cores``); False where the engines do not share this process."""

    # ---- weights and books
    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Make weight version ``version`` available to every engine."""

    def checkpoint(self) -> tuple[dict, list[tuple[int, str, str]]]:
        """(state, ledger): the books to resume from, atomically with the stream's ledger
        of item endings since the last call."""

    def restore(self, state: dict) -> None:
        """Continue from :meth:`checkpoint`'s state (before :meth:`start`)."""

    def take_dropped(self) -> list[DroppedGroup]:
        """The groups the algorithm dropped since the last call, by item index, where it
        asked for them (``Algorithm.wants_dropped``)."""

    # ---- metrics
    def pop_rollout_stats(self) -> dict[str, float]:
        """Rollout statistics since the last call."""

    def total_engine_stats(self) -> dict[str, float]:
        """The engines' counters, summed."""


def make_pool(
    endpoint: EndpointConfig,
    runtime: RuntimeConfig,
    spec: RolloutSpec,
    *,
    source: TaskSource,
    engine_model: torch.nn.Module,
    tokenizer: Any,
    weights: dict[str, torch.Tensor],
    version: int,
    stream: SampleStream,
    placement: Placement,
    drawn: int,
    run_dir: Path,
    device: str,
    logger: logging.Logger,
) -> Pool:
    """The configured pool, its engines built from ``spec`` and loaded with ``weights``
    as ``version``: external agents through the HTTP endpoint (``endpoint.enabled``), else
    rollout workers on ``runtime.backend`` fed by ``source`` (its first ``drawn`` items
    skipped: a resume)."""
    if endpoint.enabled:
        from streamrl.stream.endpoint.pool import EndpointPool

        return EndpointPool(
            endpoint,
            spec,
            engine_model,
            tokenizer,
            weights,
            version,
            stream,
            run_dir,
            device=device,
            logger=logger,
        )
    backend = make_backend(
        runtime, spec, placement, engine_model, tokenizer, weights, device, version
    )
    return RolloutPool(
        backend,
        stream,
        itertools.islice(source.train_iter(spec.seed), drawn, None),
        max_restarts=runtime.max_worker_restarts,
        worker_timeout_s=runtime.worker_timeout_s,
        max_consecutive_failures=spec.rollout.max_consecutive_failures,
        max_dropped_in_a_row=spec.algorithm.max_dropped_in_a_row,
        logger=logger,
        sampler=build_sampler(spec.selection, spec.rollout, spec.seed),
        task_source=source,
    )

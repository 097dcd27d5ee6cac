"""The ``runtime`` config section: backend, placement, threads, device and fault limits.
:mod:`streamrl.config.schema` assembles it into ``Config``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.config.base import Section


class RuntimeConfig(Section):
    backend: Literal["local", "process", "ray"] = Field(
        "local",
        description="Where rollout workers run: 'local' (threads of this process; "
        "breakpoint() works), 'process' (subprocesses, weights in shared memory) or 'ray' "
        "(Ray actors for the workers and the trainer; needs streamrl[ray]).",
    )
    placement: Literal["colocated", "disaggregated", "auto"] = Field(
        "disaggregated",
        description="'disaggregated': rollout workers own rollout_threads cores, the trainer the "
        "rest, both run at once. 'colocated': they time-share all cores (generation pauses "
        "while the trainer trains). 'auto': starts disaggregated, measures, keeps the faster.",
    )
    num_rollout_workers: int = Field(1, ge=1, description="Rollout workers (each has an engine).")
    rollout_threads: int | None = Field(
        None,
        ge=1,
        description="torch threads (and pinned cores) per rollout worker. Default: 1 when "
        "disaggregated, all cores when colocated.",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="Trainer torch threads. Default: all cores for SFT and evaluation; "
        "during RL, the cores left by the rollout workers (disaggregated) or all (colocated).",
    )
    pin_cpus: bool = Field(
        True,
        description="Disaggregated process/ray workers and trainer are pinned to disjoint cores.",
    )
    keep_freed_memory: bool = Field(
        True,
        description="On the CPU with glibc: freed memory stays in the trainer's process for "
        "the next update instead of going back to the kernel, so updates stop faulting "
        "their working set in again (an isolated SmolLM2 update: 0.80x as long). "
        "false: glibc's defaults.",
    )
    lend_cores: bool = Field(
        True,
        description="Disaggregated RL on the local backend with one rollout worker, at "
        "stream.max_staleness >= 1: while the trainer waits for a batch, its thread runs "
        "the rollout engine's steps on every core (trainer + rollout threads), and the "
        "engine's own thread waits (SmolLM2, fp16 engine weights: 0.80-0.94x the step). "
        "Steps under 20 ms (mostly Python) are left to the engine's thread. Counted in "
        "rollout/driven_steps. false: never.",
    )
    device: str = Field("cpu", description="'cpu', 'cuda' or 'auto'.")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="runtime.backend=ray: GPUs the trainer actor and each rollout worker actor "
        "ask Ray for (a fraction shares one GPU, e.g. 0.5 for a trainer and one worker).",
    )
    ray_address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'HOST:PORT'); default: start a local instance.",
    )
    worker_timeout_s: float = Field(
        60.0, gt=0, description="A rollout worker silent this long is declared lost and replaced."
    )
    max_worker_restarts: int = Field(
        3, ge=0, description="Lost rollout workers replaced before the run fails with an error."
    )
    max_trainer_restarts: int = Field(
        2,
        ge=0,
        description="Times the trainer is restarted from the latest checkpoint (a dead "
        "Ray trainer actor; a dead or hung rank of a train.world_size > 1 group) before the "
        "run fails with an error naming the cause.",
    )

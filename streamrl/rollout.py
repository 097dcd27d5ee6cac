"""Rollout worker: runs episodes on an asyncio loop, wherever it is placed.

The worker is transport-agnostic. It takes commands from ``inbox`` (a thread-safe
queue the backend fills) and reports through ``emit`` (a callable the backend
provides). The same class runs in a thread of the trainer's process, in a
subprocess, and inside a Ray actor; see :mod:`streamrl.backends`.

Commands (tuples)::

    ("items", [Item, ...])   start one group of ``group_size`` episodes per item
    ("pause",) ("resume",)   colocated placement: stop / restart decoding
    ("stop",)                cancel everything and return

Reports (tuples)::

    ("version", v, engine_stats)                 engine weight version (also a heartbeat)
    ("group", index, trajectories, reward_sum, n)
    ("reject", index, outcome, reason, detail, reward_sum, n)

One item becomes one group. Every item the worker receives is reported exactly
once: ``group`` when it is usable, ``reject`` with a counted reason otherwise
(filtered by dynamic sampling, episode rejected, episode or reward failure).
``reward_sum / n`` is the reward of every scored sample, before any filtering
(dynamic sampling biases the consumed batches towards mixed groups).
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import time
import traceback
from collections.abc import Awaitable, Callable

from streamrl.engines.base import InferenceEngine
from streamrl.types import Item, Trajectory

Episode = Callable[..., Awaitable[Trajectory | None]]
Emit = Callable[[tuple], None]

HEARTBEAT_S = 1.0


def sampling_seed(run_seed: int, item_index: int, sample: int) -> int:
    """Per-request sampling seed: fixed by (run seed, item, sample), not by timing."""
    return ((run_seed * 1_000_003 + item_index) * 1_009 + sample) % (2**62)


def zero_variance(trajectories: list[Trajectory]) -> bool:
    """Dynamic sampling (DAPO): a group whose rewards are all equal has no signal."""
    rewards = [t.reward for t in trajectories]
    return len(rewards) > 1 and max(rewards) == min(rewards)


class RolloutWorker:
    """Turns items from ``inbox`` into reported groups, using ``episode`` on ``engine``."""

    def __init__(
        self,
        engine: InferenceEngine,
        episode: Episode,
        emit: Emit,
        *,
        group_size: int,
        seed: int,
        dynamic_sampling: bool = True,
        greedy_baseline: bool = False,
    ) -> None:
        self.engine, self.episode, self.emit = engine, episode, emit
        self.group_size, self.seed = group_size, seed
        self.dynamic_sampling, self.greedy_baseline = dynamic_sampling, greedy_baseline
        self.inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()

    async def run(self, on_tick: Callable[[], None] | None = None) -> None:
        """The worker loop; returns on ``("stop",)``. ``on_tick`` runs every iteration
        before commands are read (the process backend loads new shared weights there)."""
        tasks: set[asyncio.Task] = set()
        reported, last_beat = None, 0.0
        try:
            while True:
                if on_tick is not None:
                    on_tick()
                now = time.monotonic()
                if self.engine.version != reported or now - last_beat > HEARTBEAT_S:
                    reported, last_beat = self.engine.version, now
                    stats = getattr(self.engine, "stats", None)
                    self.emit(("version", reported, dataclasses.asdict(stats) if stats else {}))
                while True:  # every queued command, so a wave of items starts together
                    try:
                        cmd = self.inbox.get_nowait()
                    except queue.Empty:
                        break
                    if cmd[0] == "stop":
                        return
                    if cmd[0] == "pause":
                        self.engine.pause()
                    elif cmd[0] == "resume":
                        self.engine.resume()
                    elif cmd[0] == "items":
                        # create every group before yielding to the loop, so the engine
                        # sees the whole wave at once (deterministic batching)
                        for item in cmd[1]:
                            tasks.add(asyncio.create_task(self._run_group(item)))
                    else:
                        raise ValueError(f"unknown rollout worker command {cmd[0]!r}")
                if tasks:
                    done, tasks = await asyncio.wait(
                        tasks, timeout=0.005, return_when=asyncio.FIRST_COMPLETED
                    )
                    for t in done:
                        t.result()  # re-raise bugs in the worker itself
                else:
                    await asyncio.sleep(0.002)
        finally:
            self.engine.resume()  # a paused engine would block cancellation forever
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_group(self, item: Item) -> None:
        coros = [
            self.episode(self.engine, item, sampling_seed(self.seed, item.index, j))
            for j in range(self.group_size)
        ]
        if self.greedy_baseline:  # ReMax: a greedy rollout gives the baseline reward
            coros.append(self.episode(self.engine, item, 0, greedy=True))
        results = await asyncio.gather(*coros, return_exceptions=True)
        if any(isinstance(r, asyncio.CancelledError) for r in results):
            return  # shutting down: the controller accounts for unreported items
        self.emit(self._outcome(item, results))

    def _outcome(self, item: Item, results: list) -> tuple:
        index = item.index
        for r in results:
            if isinstance(r, BaseException):
                detail = "".join(traceback.format_exception(r)).strip()
                return (
                    "reject",
                    index,
                    "failed",
                    f"episode_error:{type(r).__name__}",
                    detail,
                    0,
                    0,
                )
        if any(r is None for r in results):
            return ("reject", index, "filtered", "episode_rejected", "", 0, 0)
        trajectories: list[Trajectory] = list(results)
        for t in trajectories:
            errors = t.metadata.get("reward_errors") or {}
            if errors:
                name, text = next(iter(errors.items()))
                return ("reject", index, "failed", f"reward_error:{name}", text, 0, 0)
        scored = trajectories[: self.group_size]
        reward_sum, n = sum(t.reward for t in scored), len(scored)
        if self.greedy_baseline:
            baseline = trajectories.pop()
            for t in trajectories:
                t.metadata["baseline_reward"] = baseline.reward
        if self.dynamic_sampling and zero_variance(trajectories):
            return ("reject", index, "filtered", "zero_reward_std", "", reward_sum, n)
        return ("group", index, trajectories, reward_sum, n)

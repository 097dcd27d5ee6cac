"""Rollout worker: runs episodes on an asyncio loop and feeds the sample stream.

One item becomes one group of ``group_size`` episodes. The worker asks the
stream for admission *before* starting a group (so nothing is generated only to
be dropped), and reports every group exactly once: ``put`` when it is usable,
``reject`` with a counted reason otherwise (filtered by dynamic sampling, episode
rejected, episode or reward failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator

from streamrl.engines.base import InferenceEngine
from streamrl.stream import Group, SampleStream, StreamClosed
from streamrl.types import Item, Trajectory

Episode = Callable[..., Awaitable[Trajectory | None]]


def sampling_seed(run_seed: int, item_index: int, sample: int) -> int:
    """Per-request sampling seed: fixed by (run seed, item, sample), not by timing."""
    return ((run_seed * 1_000_003 + item_index) * 1_009 + sample) % (2**62)


def zero_variance(trajectories: list[Trajectory]) -> bool:
    """Dynamic sampling (DAPO): a group whose rewards are all equal has no signal."""
    rewards = [t.reward for t in trajectories]
    return len(rewards) > 1 and max(rewards) == min(rewards)


class RolloutWorker:
    """Produces groups into ``stream`` from ``items`` using ``episode`` on ``engine``."""

    def __init__(
        self,
        engine: InferenceEngine,
        items: Iterator[Item],
        episode: Episode,
        stream: SampleStream,
        *,
        group_size: int,
        seed: int,
        dynamic_sampling: bool = True,
        greedy_baseline: bool = False,
        max_inflight: int | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.engine, self.items, self.episode, self.stream = engine, items, episode, stream
        self.group_size, self.seed = group_size, seed
        self.dynamic_sampling, self.greedy_baseline = dynamic_sampling, greedy_baseline
        self.max_inflight = max_inflight or 1_000_000
        self.log = logger or logging.getLogger("streamrl.rollout")
        self.error: BaseException | None = None
        # reward of every scored sample, before any filtering (dynamic sampling
        # biases the consumed batches towards mixed groups)
        self._reward_lock = threading.Lock()
        self._reward_sum, self._reward_n = 0.0, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- threading

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rollout", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.log.warning("rollout thread did not stop within %.0fs", timeout)

    def _run(self) -> None:
        try:
            asyncio.run(self.run())
        except StreamClosed:
            pass
        except BaseException as e:  # surfaced to the trainer by the controller
            self.error = e
            self.log.error("rollout worker crashed:\n%s", traceback.format_exc())

    def pop_reward_stats(self) -> dict[str, float]:
        """Mean reward of all samples scored since the last call (filtered ones too)."""
        with self._reward_lock:
            total, n = self._reward_sum, self._reward_n
            self._reward_sum, self._reward_n = 0.0, 0
        return {"rollout/reward_mean": total / n, "rollout/samples": n} if n else {}

    # -------------------------------------------------------------- the loop

    async def run(self) -> None:
        tasks: set[asyncio.Task] = set()
        try:
            while not self._stop.is_set():
                room = self.max_inflight - len(tasks)
                indices = self.stream.admit(self.engine.version, room, timeout=0) if room else []
                # create every admitted group before yielding to the loop, so the
                # engine sees the whole wave at once (deterministic batching)
                for index in indices:
                    item = next(self.items)
                    item.index = index
                    tasks.add(asyncio.create_task(self._run_group(item)))
                if tasks:
                    done, tasks = await asyncio.wait(
                        tasks, timeout=0.005, return_when=asyncio.FIRST_COMPLETED
                    )
                    for t in done:
                        t.result()  # re-raise bugs in the worker itself
                else:
                    await asyncio.sleep(0.002)
        finally:
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
        with contextlib.suppress(StreamClosed):
            self._report(item, results)

    def _report(self, item: Item, results: list) -> None:
        index = item.index
        for r in results:
            if isinstance(r, BaseException):
                if isinstance(r, (asyncio.CancelledError, StreamClosed)):
                    raise StreamClosed
                self.log.error(
                    "episode failed for item %s (%s): %s",
                    item.id,
                    index,
                    "".join(traceback.format_exception(r)).strip(),
                )
                self.stream.reject(index, "failed", f"episode_error:{type(r).__name__}")
                return
        if any(r is None for r in results):
            self.stream.reject(index, "filtered", "episode_rejected")
            return
        trajectories: list[Trajectory] = list(results)
        for t in trajectories:
            errors = t.metadata.get("reward_errors") or {}
            if errors:
                name, text = next(iter(errors.items()))
                self.log.error("reward %r failed on item %s: %s", name, item.id, text)
                self.stream.reject(index, "failed", f"reward_error:{name}")
                return
        with self._reward_lock:
            self._reward_sum += sum(t.reward for t in trajectories[: self.group_size])
            self._reward_n += self.group_size
        if self.greedy_baseline:
            baseline = trajectories.pop()
            for t in trajectories:
                t.metadata["baseline_reward"] = baseline.reward
        if self.dynamic_sampling and zero_variance(trajectories):
            self.stream.reject(index, "filtered", "zero_reward_std")
            return
        self.stream.put(Group(index, -1, trajectories))

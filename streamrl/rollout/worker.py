"""Rollout worker: runs episodes on an asyncio loop, wherever it is placed.

The worker is transport-agnostic. It takes commands (:mod:`streamrl.core.messages`)
from ``inbox``, a thread-safe queue the backend fills, and reports through
``emit``, a callable the backend provides. The same class runs in a thread of the
trainer's process, in a subprocess, and inside a Ray actor
(:mod:`streamrl.stream.backends`).

One item becomes one group: ``group_size`` sampled episodes plus the extra
rollouts the algorithm asks for (ReMax's greedy baseline). Every item the worker
receives is reported exactly once: ``GroupDone`` when usable, ``GroupRejected``
with a counted reason otherwise (an episode that raised or was rejected, a
reward failure, or the algorithm's filter such as dynamic sampling). The run's group
sampler (:mod:`streamrl.rollout.selection`) decides how each group is drawn, and does
the work the pool hands an idle worker for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from streamrl.algorithms import Algorithm, Filtered
from streamrl.core.engine import CountsStats, InferenceEngine
from streamrl.core.messages import (
    Command,
    GroupDone,
    GroupRejected,
    Pause,
    Report,
    Resume,
    SamplerResult,
    SamplerWork,
    StartItems,
    Stop,
    VersionReport,
)
from streamrl.core.types import HINT_KEY, WEIGHT_KEY, Item, Trajectory
from streamrl.rollout.episodes import Episode, PromptTooLong, Trajectories, episode_output
from streamrl.rollout.reports import failed_report
from streamrl.rollout.rewards.registry import CompositeReward
from streamrl.rollout.rewards.scoring import add_group_rewards
from streamrl.rollout.seeds import sampling_seed as sampling_seed  # (the endpoint's import)
from streamrl.rollout.selection.base import GroupSampler

Emit = Callable[[Report], None]

HEARTBEAT_S = 1.0


def episode_metrics(
    trajectories: list[Trajectory], outputs: Sequence[Trajectories] = ()
) -> dict[str, float]:
    """Sums of the per-episode metrics episodes leave in ``metadata["metrics"]`` (or, for
    an episode of several seats, in its ``Trajectories.metrics``), and ``episodes``, how
    many episodes reported (the pool turns the sums into means)."""
    total: Counter[str] = Counter()
    for t in trajectories:
        if "metrics" in t.metadata:
            total.update(t.metadata["metrics"])
            total["episodes"] += 1
    for o in outputs:
        if o.metrics:
            total.update(o.metrics)
            total["episodes"] += 1
    return dict(total)


class RolloutWorker:
    """Turns items from ``inbox`` into reported groups, using ``episode`` on ``engine``."""

    def __init__(
        self,
        engine: InferenceEngine,
        episode: Episode,
        algorithm: Algorithm,
        emit: Emit,
        *,
        group_size: int,
        seed: int,
        sampler: GroupSampler | None = None,
        reward: CompositeReward | None = None,
    ) -> None:
        self.engine, self.episode, self.algorithm, self.emit = engine, episode, algorithm, emit
        self.group_size, self.seed, self.reward = group_size, seed, reward
        self.sampler = sampler if sampler is not None else GroupSampler()
        self.inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()

    async def run(self, on_tick: Callable[[], None] | None = None) -> None:
        """The worker loop; returns on ``Stop``. ``on_tick`` runs every iteration
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
                    counts = self.engine.stats if isinstance(self.engine, CountsStats) else None
                    self.emit(VersionReport(reported, dataclasses.asdict(counts) if counts else {}))
                while True:  # every queued command, so a wave of items starts together
                    try:
                        cmd = self.inbox.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(cmd, Stop):
                        return
                    if isinstance(cmd, Pause):
                        self.engine.pause()
                    elif isinstance(cmd, Resume):
                        self.engine.resume()
                    elif isinstance(cmd, StartItems):
                        # create every group before yielding to the loop, so the engine
                        # sees the whole wave at once (deterministic batching)
                        tasks.update(asyncio.create_task(g) for g in self.groups(cmd))
                    elif isinstance(cmd, SamplerWork):
                        tasks.add(asyncio.create_task(self._work(cmd)))
                    else:
                        raise TypeError(f"unknown rollout worker command {cmd!r}")
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

    def groups(self, cmd: StartItems) -> list[Coroutine[Any, Any, None]]:
        """One coroutine per item of ``cmd``, each reporting its group through ``emit``."""
        return [self._run_group(item, plan) for item, plan in cmd.planned()]

    async def _run_group(self, item: Item, plan: Any) -> None:
        report = await rollout_group(
            self.engine,
            self.episode,
            self.algorithm,
            item,
            self.group_size,
            self.seed,
            self.sampler,
            plan,
            reward=self.reward,
        )
        if report is not None:  # None: shutting down, the pool accounts for the item
            self.emit(report)

    async def _work(self, cmd: SamplerWork) -> None:
        try:
            result = await self.sampler.work(self.engine, cmd.payload)
        except asyncio.CancelledError:
            return  # shutting down: the pool's side keeps what it handed out
        self.emit(SamplerResult(result))


async def rollout_group(
    engine: InferenceEngine,
    episode: Episode,
    algorithm: Algorithm,
    item: Item,
    group_size: int,
    seed: int,
    sampler: GroupSampler | None = None,
    plan: Any = None,
    *,
    reward: CompositeReward | None = None,
) -> GroupDone | GroupRejected | None:
    """Roll one item out ``group_size`` times (plus the algorithm's extra rollouts),
    score it and judge it; None if cancelled. Every other outcome is a report. The
    ``sampler`` (the plain one by default) decides with the item's ``plan`` which item
    is rolled out after all, and how its samples are drawn. ``reward``'s group
    components (if any) score the group once its samples are in (the episode scored
    each answer by the per-answer ones)."""
    sampler = sampler if sampler is not None else GroupSampler()

    async def roll(chosen: Item) -> GroupDone | GroupRejected | None:
        draws = sampler.group(engine, chosen, group_size, seed)  # (its own budget, maybe)
        return await _rollout(engine, episode, algorithm, chosen, draws, len(draws), reward)

    return await sampler.rollout(engine, item, plan, roll)


async def _rollout(
    engine: InferenceEngine,
    episode: Episode,
    algorithm: Algorithm,
    item: Item,
    draws: list[tuple[InferenceEngine, int]],
    group_size: int,
    reward: CompositeReward | None = None,
) -> GroupDone | GroupRejected | None:
    """The group of ``item``, each sample drawn on its (engine view, seed), generated,
    scored (each answer, then the group with the extra rollouts in it) and judged
    (None: cancelled)."""
    coros = [episode(view, item, s) for view, s in draws]
    coros += [episode(engine, item, 0, greedy=x.greedy) for x in algorithm.extra_rollouts]
    results = await asyncio.gather(*coros, return_exceptions=True)
    if any(isinstance(r, asyncio.CancelledError) for r in results):
        return None
    index = item.index
    for r in results:
        if isinstance(r, PromptTooLong):  # the item cannot be rolled out: filtered
            return GroupRejected(index, "filtered", r.reason, str(r))
        if isinstance(r, BaseException):
            return failed_report(index, "episode_error", r)
    if any(r is None for r in results):
        return GroupRejected(index, "filtered", "episode_rejected")
    # an episode of several seats gives several trajectories (or none, when it failed)
    outputs = [episode_output(r) for r in results]
    samples = [t for o in outputs[:group_size] for t in o.trajectories]
    rest = [t for o in outputs[group_size:] for t in o.trajectories]
    trajectories: list[Trajectory] = samples + rest
    await add_group_rewards(reward, item, trajectories)
    # a mixture's domain and correct reward, for per-domain metrics; the sample's weight;
    # its hint
    for t in trajectories:
        for key in ("domain", "correct_reward", WEIGHT_KEY, HINT_KEY):
            if key in item.metadata:
                t.metadata.setdefault(key, item.metadata[key])
    metrics = episode_metrics(trajectories, outputs)
    for t in trajectories:
        errors = t.metadata.get("reward_errors") or {}
        if errors:
            name, text = next(iter(errors.items()))
            return GroupRejected(
                index, "failed", f"reward_error:{name}", text, episode_metrics=metrics
            )
    if not samples or len(rest) != len(algorithm.extra_rollouts):  # every episode failed
        reason = next((o.error for o in outputs if o.error), "no_trajectories")
        return GroupRejected(index, "failed", reason, "", episode_metrics=metrics)
    extras = {x.name: t for x, t in zip(algorithm.extra_rollouts, rest, strict=True)}
    rewards = tuple(float(t.reward) for t in samples)
    reward_sum, n = sum(rewards), len(samples)
    kept = algorithm.finish_group(samples, extras)
    if isinstance(kept, Filtered):
        kept_samples = tuple(samples) if algorithm.wants_dropped else ()
        return GroupRejected(
            index, "filtered", kept.reason, "", reward_sum, n, metrics, rewards, None, kept_samples
        )
    return GroupDone(index, tuple(kept), reward_sum, n, metrics, rewards)

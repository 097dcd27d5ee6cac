"""What every producer of groups keeps for the controller, whatever drives the
episodes (rollout workers, or external agents through the HTTP endpoint).

:class:`PoolBooks` is what both pools (:class:`~streamrl.stream.pools.Pool`) share:
``publish`` weights and time them (``publish_s``; ``sync_latency`` until every engine
runs the version), turn admission on and off (``admit``), the defaults of the optional
controls (``drive_engines``, ``work_ahead``), ``raise_if_failed``, per-step rollout
statistics (``pop_rollout_stats``), and the run's group ``sampler`` (its counters; the
plain sampler where the pool issues no items of its own). The bookkeeping the trainer
thread touches sits under a small lock that is never held for long, so the trainer never
waits for a pump iteration (on a one-core trainer that can be a scheduling slice or more).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import torch

from streamrl.algorithms.base import EQUAL_REWARDS
from streamrl.core.messages import DroppedGroup, GroupDone, GroupRejected
from streamrl.rollout.selection.base import GroupSampler

START_TIMEOUT_S = 180.0  # silence allowed before a (re)started worker's first report


class WorkersUnreachable(RuntimeError):
    """The trainer cannot reach enough rollout workers to go on."""


class EpisodesFailing(RuntimeError):
    """Every recent item failed: the run cannot learn (a broken reward, bad data, ...)."""


class NothingToLearn(EpisodesFailing):
    """Every recent group was dropped for equal rewards (``algorithm.max_dropped_in_a_row``):
    the policy gets every sample right, or every one wrong."""


class PoolBooks:
    def __init__(self) -> None:
        self.restarts = 0  # rollout workers replaced
        self.reissued = 0  # items issued again after a worker was lost
        self.resumed_items = 0  # items issued again after a resume
        self.error: BaseException | None = None
        self._hold = False  # admission off (admit(False))
        self._stats_lock = threading.Lock()
        self._published: dict[int, float] = {}  # version -> publish start
        self.sync_latency: dict[int, float] = {}  # version -> seconds until all loaded
        self.publish_s: dict[int, float] = {}
        self._reward_sum, self._reward_n = 0.0, 0
        self._equal_groups, self._equal_reward = 0, 0.0  # dropped for equal rewards, the run's
        self._episode_metrics: Counter[str] = Counter()  # summed episode metrics
        self.sampler = GroupSampler()  # which items are issued (the rollout pool sets it)
        self._dropped_groups: list[DroppedGroup] = []  # for the algorithm (``take_dropped``)
        self._dropped_lock = threading.Lock()

    def note_dropped_group(self, msg: GroupRejected, answer: str | None) -> None:
        """Keep a dropped group's samples (when the worker sent them) for the algorithm."""
        if msg.samples:
            with self._dropped_lock:
                self._dropped_groups.append(DroppedGroup(msg.item_index, list(msg.samples), answer))

    def take_dropped(self) -> list[DroppedGroup]:
        """The dropped groups kept since the last call, by item index (so their order
        does not depend on which finished first)."""
        with self._dropped_lock:
            out, self._dropped_groups = self._dropped_groups, []
        return sorted(out, key=lambda g: g.item_index)

    def dropped_state(self) -> list[DroppedGroup]:
        """The dropped groups not yet taken (a checkpoint keeps them)."""
        with self._dropped_lock:
            return list(self._dropped_groups)

    def restore_dropped(self, groups: list[DroppedGroup]) -> None:
        with self._dropped_lock:
            self._dropped_groups = list(groups)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def admit(self, on: bool) -> None:
        """Admit new items (``True``, the default) or none (``False``); what was admitted
        goes on either way."""
        self._hold = not on

    def work_ahead(self, on: bool) -> None:
        """Whether idle workers may work ahead of demand (the default: nothing to do)."""

    def drive_engines(self, threads: int, until: Callable[[], bool]) -> bool:
        """The caller's thread (the trainer's, waiting for a batch: ``runtime.lend_cores``)
        runs inference steps until ``until()`` is true or there is no work. False where
        this pool cannot lend its engines a thread (the default)."""
        return False

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        with self._stats_lock:  # popped when the last engine loads the version
            self._published[version] = t0
        self._publish(state_dict, version)
        self.publish_s[version] = time.perf_counter() - t0

    def _publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        raise NotImplementedError

    def _synced(self, low: int) -> None:
        """Every engine now runs ``low`` or newer: the sync latency of those versions."""
        with self._stats_lock:
            for version in [v for v in self._published if v <= low]:
                start = self._published.pop(version)
                self.sync_latency[version] = time.perf_counter() - start

    def _add_rollout_stats(self, msg: GroupDone | GroupRejected) -> None:
        with self._stats_lock:
            self._reward_sum += msg.reward_sum
            self._reward_n += msg.scored
            self._episode_metrics.update(msg.episode_metrics)
            if isinstance(msg, GroupRejected) and msg.reason == EQUAL_REWARDS and msg.scored:
                self._equal_groups += 1
                self._equal_reward += msg.reward_sum / msg.scored

    def total_engine_stats(self) -> dict[str, float]:
        """The inference engines' counters, summed."""
        raise NotImplementedError

    def pop_rollout_stats(self) -> dict[str, float]:
        """Since the last call: the mean reward of every scored sample (filtered ones
        too), and the mean per episode of each metric episodes report (``agent/turns``,
        ``tools/errors/<kind>``, ...; an episode that did not report one counts 0). Over
        the whole run: ``rollout/equal_reward_groups_reward_mean``, the mean reward of the
        groups dropped for equal rewards (0/1 rewards: the share that were all correct;
        a group sampler may predict those)."""
        with self._stats_lock:
            total, n = self._reward_sum, self._reward_n
            equal_n, equal_reward = self._equal_groups, self._equal_reward
            sums = dict(self._episode_metrics)
            self._reward_sum, self._reward_n = 0.0, 0
            self._episode_metrics.clear()
        episodes = sums.pop("episodes", 0)
        out = {k: float(v) / episodes for k, v in sums.items()} if episodes else {}
        if n:
            out.update({"rollout/reward_mean": total / n, "rollout/samples": n})
        if equal_n:
            out["rollout/equal_reward_groups_reward_mean"] = equal_reward / equal_n
        return out

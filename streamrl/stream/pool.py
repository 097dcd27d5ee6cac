"""RolloutPool: the controller's side of every backend.

A pump thread in the trainer's process:

1. drains worker reports into the sample stream (``put`` / ``reject``);
2. notices dead or silent workers, replaces them, and re-issues the items they
   held (same item index, same sampling seeds), so nothing is lost and, since a
   group is reported in one message, nothing is consumed twice;
3. admits new items for each worker at that worker's *acknowledged* weight
   version. Versions only grow, so an item's tokens all have versions >= the
   version it was admitted at, which is what the stream's staleness proof needs.

Items are kept until they end, so ``checkpoint()`` can hand every issued but
unconsumed item to a checkpoint and ``restore()`` can issue it again. A run whose
episodes keep failing (a broken reward, a bad data file) stops after
``max_consecutive_failures`` failed items in a row with an error quoting the first
failure; failures also reach the console, at most one line per ``WARN_EVERY_S``.

The run's group sampler (``sampler``, :mod:`streamrl.rollout.selection`) sits where
items are issued: it picks the item for each admitted index (an item it draws from the
task source counts in ``drawn``, the source's position, whether it is issued or not),
gives each its plan for the worker, learns from each ended item, may hand an idle
worker work of its own, and keeps its state in the checkpoints. Every backend and a
resume share this one path.

Weight publication is timed twice: ``publish_s`` is what the trainer spends
making the weights available; ``latency_s`` runs until every live worker has
reported the new version (its engine loaded it between two decode steps).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

import torch

from streamrl.algorithms.base import EQUAL_REWARDS
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
from streamrl.core.types import Item
from streamrl.rollout.episodes.base import PromptTooLong
from streamrl.rollout.selection.base import GroupSampler, Source
from streamrl.sources.base import TaskSource
from streamrl.stream.backends.base import Backend, WorkerLost
from streamrl.stream.books import (
    START_TIMEOUT_S,
    EpisodesFailing,
    NothingToLearn,
    PoolBooks,
    WorkersUnreachable,
)
from streamrl.stream.sample_stream import Group, SampleStream, StreamClosed

WARN_EVERY_S = 10.0  # console summary of failed items, at most this often
console = logging.getLogger("streamrl.failures")


class RolloutPool(PoolBooks):
    """Admits items from the task source, hands them to the backend's workers, and
    turns their reports into the stream's groups (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        stream: SampleStream,
        items: Iterator[Item],
        *,
        max_restarts: int = 3,
        worker_timeout_s: float = 60.0,
        max_consecutive_failures: int = 0,
        max_dropped_in_a_row: int = 0,
        interval_s: float = 0.002,
        logger: logging.Logger | None = None,
        sampler: GroupSampler | None = None,
        task_source: TaskSource | None = None,
    ) -> None:
        super().__init__()
        self.backend, self.stream, self.items = backend, stream, items
        self.max_restarts, self.worker_timeout_s = max_restarts, worker_timeout_s
        self.max_consecutive_failures = max_consecutive_failures  # 0: never stop
        self.max_dropped_in_a_row = max_dropped_in_a_row  # equal-reward groups; 0: never
        self.interval_s = backend.poll_interval_s or interval_s
        self.log = logger or logging.getLogger("streamrl.pool")
        n = backend.num_workers
        self.versions: list[int | None] = [None] * n  # acknowledged engine version
        self.inflight: list[dict[int, Item]] = [{} for _ in range(n)]
        self.engine_stats: list[dict] = [{} for _ in range(n)]
        self._last_seen = [time.monotonic()] * n
        self._orphans: list[Item] = []  # items of dead workers, waiting for a new home
        self.drawn = 0  # items taken from the task source (its position, for resume)
        self._items: dict[int, Item] = {}  # issued and not yet ended (pruned at checkpoints)
        self._quiet = False  # paused: no work for the sampler on idle workers
        self._streak, self._streak_first = 0, ""  # failed items in a row, and the first
        self._unwarned, self._last_warn = 0, 0.0
        self._dropped = (0, 0.0, 0)  # groups dropped in a row, their reward sum and samples
        self._too_long = 0  # items filtered in a row: no room in the context for their prompt
        self._last_drop_warn = 0.0
        self._lock = threading.RLock()  # the pump's state: reports, sends, in-flight items
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sampler = sampler if sampler is not None else GroupSampler()
        limits = (stream.items_per_batch, stream.max_staleness)
        self.sampler.attach(Source(self._draw, *limits, task_source))

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.backend.start()
        self._last_seen = [time.monotonic()] * self.backend.num_workers
        self._thread = threading.Thread(target=self._pump, name="rollout-pool", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for w in range(self.backend.num_workers):
            with contextlib.suppress(WorkerLost):
                self.backend.send(w, Stop())
        self.backend.close()

    # ------------------------------------------------------------ checkpoints

    def _publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # before any item can be admitted at ``version``
        self.sampler.published(version, self.stream.outstanding_indices())
        self.backend.publish(state_dict, version)

    def checkpoint(self) -> tuple[dict, list[tuple[int, str, str]]]:
        """(state, ledger): the stream's books and every issued but unconsumed item, the
        task source's position, the pool's counters and the group sampler's state, taken
        in one atomic step with the stream's ledger of item endings since the last drain."""
        with self._lock:
            self.sampler.catch_up()
            state, ledger = self.stream.checkpoint()
            keep = set(state["outstanding"])
            self._items = {i: it for i, it in self._items.items() if i in keep}
            state["items"] = [copy.deepcopy(self._items[i]) for i in sorted(keep)]
            state.update(drawn=self.drawn, restarts=self.restarts, reissued=self.reissued)
            state["dropped"] = self.dropped_state()
            sampled = self.sampler.state_dict(keep)
            if sampled is not None:
                state["selection"] = sampled
        return state, ledger

    def restore(self, state: dict) -> None:
        """Continue from :meth:`checkpoint`'s state (before :meth:`start`). ``items``
        (the pool's task-source iterator) must already skip the ``drawn`` items."""
        self.stream.restore(state)
        self._orphans = sorted(state["items"], key=lambda it: it.index)
        self._items = {it.index: it for it in self._orphans}
        self.resumed_items += len(self._orphans)
        self.restore_dropped(state.get("dropped", []))
        self.drawn, self.restarts, self.reissued = (
            state["drawn"],
            state["restarts"],
            state["reissued"],
        )
        # (checkpoints written before the group sampler kept the likelihood gate's state
        # under "candidates")
        sampled = state.get("selection", state.get("candidates"))
        if sampled is not None:
            self.sampler.load_state_dict(sampled)

    # ------------------------------------------------------------ trainer-side calls

    def wait_version(self, version: int, timeout: float | None = None) -> None:
        """Block until every live worker runs ``version`` (or newer)."""
        deadline = time.monotonic() + (timeout or self.worker_timeout_s)
        while not all(v is not None and v >= version for v in self.versions):
            self.raise_if_failed()
            if time.monotonic() > deadline:
                raise WorkersUnreachable(
                    f"rollout workers did not load weight version {version} within "
                    f"{timeout or self.worker_timeout_s:.0f}s (versions: {self.versions})"
                )
            time.sleep(0.001)

    def drive_engines(self, threads: int, until: Callable[[], bool]) -> bool:
        """The caller's thread runs the rollout engine's steps with ``threads`` torch
        threads until ``until()`` is true or the engine runs out of work
        (``runtime.lend_cores``). False where it cannot: only the local backend's single
        engine shares this process."""
        return self.backend.drive(threads, until)

    def pause_generation(self) -> None:
        """Every engine stops between two decode steps until :meth:`resume_generation`
        (colocated placement: the trainer takes the cores), and nothing is scored ahead."""
        self._quiet = True
        self._broadcast(Pause())

    def resume_generation(self) -> None:
        self._quiet = False
        self._broadcast(Resume())

    def work_ahead(self, on: bool) -> None:
        """Whether idle workers may do the group sampler's work ahead of demand (the
        likelihood gate's ``selection.score_ahead``). The trainer turns it off around
        evaluations: a worker thread working ahead would slow them down (the GIL)."""
        self._quiet = not on

    def finish_inflight(self) -> None:
        """Wait until every admitted item has been reported (turn admission off first)."""
        while any(self.inflight) or self._orphans:
            self.raise_if_failed()
            time.sleep(0.001)

    def total_engine_stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for stats in self.engine_stats:
            for k, v in stats.items():
                out[k] = out.get(k, 0) + v
        return out

    def _broadcast(self, command: Command) -> None:
        for w in range(self.backend.num_workers):  # backends' send is thread-safe
            with contextlib.suppress(WorkerLost):  # the pump replaces it
                self.backend.send(w, command)

    # ------------------------------------------------------------ the pump

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                # off the lock: a worker's reports can stream in for a while, and the
                # trainer's checkpoint of these books must not wait for the last one
                reports = self.backend.poll()
                with self._lock:
                    self.sampler.catch_up()
                    busy = self._receive(reports)
                    self._check_workers()
                    busy |= self._dispatch()
                if not busy:
                    time.sleep(self.interval_s)
        except StreamClosed:
            pass
        except BaseException as e:  # surfaced to the trainer by raise_if_failed
            known = isinstance(e, WorkersUnreachable | EpisodesFailing)
            self.error = e if known else RuntimeError(f"rollout pool failed: {e!r}")
            if not known:
                self.error.__cause__ = e
            self.log.error("rollout pool stopped: %s", e)

    def _receive(self, reports: list[tuple[int, Report]]) -> bool:
        now = time.monotonic()
        for w, msg in reports:
            self._last_seen[w] = now
            if isinstance(msg, VersionReport):
                self.versions[w] = msg.version
                self.engine_stats[w] = msg.engine_stats
                self._note_sync(now)
            elif isinstance(msg, SamplerResult):
                self.sampler.work_done(w, msg.payload)
            elif isinstance(msg, GroupDone | GroupRejected):
                item = self.inflight[w].pop(msg.item_index, None)
                if item is None:
                    continue  # a late report of an item already re-issued elsewhere
                self.sampler.finished(item, msg)  # before the stream may end the item
                self._add_rollout_stats(msg)
                self._note_failure(msg)
                self._note_dropped(msg)
                if isinstance(msg, GroupDone):
                    self.stream.put(Group(msg.item_index, -1, list(msg.trajectories)))
                    continue
                if msg.detail:  # a failure is an error; a filtered item only says why
                    level = logging.ERROR if msg.outcome == "failed" else logging.DEBUG
                    what = (msg.item_index, msg.outcome, msg.reason, msg.detail)
                    self.log.log(level, "item %d %s (%s): %s", *what)
                self._items.pop(msg.item_index, None)
                self.note_dropped_group(msg, item.answer)
                self.stream.reject(msg.item_index, msg.outcome, msg.reason)
            else:
                raise TypeError(f"unknown report {msg!r} from rollout worker {w}")
        return bool(reports)

    def _note_failure(self, msg: GroupDone | GroupRejected) -> None:
        """Count failed items in a row; warn on the console (rate-limited); give up
        after ``max_consecutive_failures`` with the streak's first failure quoted."""
        if not (isinstance(msg, GroupRejected) and msg.outcome == "failed"):
            self._streak = 0
            return
        if self._streak == 0:
            first_line = (msg.detail.strip().splitlines() or [""])[0][:300]
            self._streak_first = f"{msg.reason}: {first_line}"
        self._streak += 1
        self._unwarned += 1
        now = time.monotonic()
        if now - self._last_warn >= WARN_EVERY_S:
            console.warning(
                "%d item(s) failed since the last report; latest: %s (details in run.log)",
                self._unwarned,
                msg.reason,
            )
            self._unwarned, self._last_warn = 0, now
        limit = self.max_consecutive_failures
        if limit and self._streak >= limit:
            raise EpisodesFailing(
                f"{self._streak} items in a row failed (rollout.max_consecutive_failures="
                f"{limit}); the first: {self._streak_first}"
            )

    def _note_dropped(self, msg: GroupDone | GroupRejected) -> None:
        """Count generated groups dropped for equal rewards in a row (a consumed group
        resets it; a failed or gate-skipped item, never generated, leaves it): warn from
        100 on, rate-limited, and give up after ``max_dropped_in_a_row`` (the policy gets
        every sample right, or every one wrong, and dynamic sampling would spin). Items
        filtered as prompt_too_long are counted in a row the same way (none can be learned
        from; a consumed group resets the count) and stop the run at the same limit."""
        if isinstance(msg, GroupDone):
            self._dropped, self._too_long = (0, 0.0, 0), 0
            return
        if msg.reason == PromptTooLong.reason:  # (preflight counts them in the first items)
            self._too_long += 1
            if self.max_dropped_in_a_row and self._too_long >= self.max_dropped_in_a_row:
                raise NothingToLearn(
                    f"{self._too_long} items in a row were filtered because their prompt "
                    "leaves no room for a generated token in the model's context "
                    "(prompt_too_long): shorten the prompts or use a model with a longer "
                    f"context (algorithm.max_dropped_in_a_row={self.max_dropped_in_a_row})"
                )
        if msg.reason != EQUAL_REWARDS:
            return
        n, reward, samples = self._dropped
        n, reward, samples = n + 1, reward + msg.reward_sum, samples + msg.scored
        self._dropped = (n, reward, samples)
        limit, now = self.max_dropped_in_a_row, time.monotonic()
        warn = n >= 100 and now - self._last_drop_warn >= WARN_EVERY_S
        if not (warn or (limit and n >= limit)):
            return
        what = (
            f"{n} groups in a row were dropped for equal rewards (dynamic sampling; their "
            f"samples' mean reward {reward / max(samples, 1):.3f})"
        )
        if warn:
            console.warning("%s: nothing to learn from them so far", what)
            self._last_drop_warn = now
        if limit and n >= limit:
            raise NothingToLearn(
                f"{what}: each group's samples all got the same reward (all right or all "
                "wrong), so nothing can be learned: start from a stronger policy (sft.steps) "
                f"or use an easier task (algorithm.max_dropped_in_a_row={limit} sets this "
                "limit; 0 = never stop)"
            )

    def _note_sync(self, now: float) -> None:
        live = [v for v in self.versions if v is not None]
        if len(live) < len(self.versions):
            return
        low = min(live)
        self._synced(low)

    def _check_workers(self) -> None:
        gone = dict(self.backend.dead())
        now = time.monotonic()
        for w in range(self.backend.num_workers):
            # a worker starting up (importing torch, building its model, waiting for
            # a Ray scheduler) gets longer before its first report
            limit = self.worker_timeout_s
            if self.versions[w] is None:
                limit = max(limit, START_TIMEOUT_S)
            if w not in gone and now - self._last_seen[w] > limit:
                gone[w] = f"no report for {limit:.0f}s (runtime.worker_timeout_s)"
        for w, why in gone.items():
            self._replace(w, why)

    def _replace(self, w: int, why: str) -> None:
        held = list(self.inflight[w].values())
        self.log.warning(
            "rollout worker %d lost (%s); re-issuing its %d in-flight items", w, why, len(held)
        )
        if not self.backend.restartable:
            raise WorkersUnreachable(
                f"rollout worker {w} ({self.backend.name} backend) died: {why}"
            )
        if self.restarts >= self.max_restarts:
            raise WorkersUnreachable(
                f"rollout worker {w} lost ({why}) and runtime.max_worker_restarts="
                f"{self.max_restarts} replacements are used up; giving up instead of waiting"
            )
        self._orphans.extend(sorted(held, key=lambda it: it.index))
        self.reissued += len(held)
        self.sampler.worker_lost(w)
        self.inflight[w] = {}
        self.versions[w] = None
        self.restarts += 1
        self.backend.restart(w)
        self._last_seen[w] = time.monotonic()

    def _dispatch(self) -> bool:
        """Hand orphans, then newly admitted items, to ready workers (fewest in flight first)."""
        if self._hold:
            return False
        ready = [w for w, v in enumerate(self.versions) if v is not None and v >= 0]
        if not ready:
            return False
        sent = False
        chunk = max(1, math.ceil(self.stream.items_per_batch / len(ready)))
        for w in sorted(ready, key=lambda w: len(self.inflight[w])):
            items: list[Item] = []
            while self._orphans and len(items) < chunk:
                items.append(self._orphans.pop(0))
            room = chunk - len(items)
            if room:
                for index in self.stream.admit(self.versions[w], room, timeout=0):
                    item = self.sampler.issue(index)
                    item.index = index
                    self._items[index] = item
                    items.append(item)
            if items:
                for item in items:
                    self.inflight[w][item.index] = item
                plans = tuple(self.sampler.plan(it.index) for it in items)
                message = StartItems(
                    tuple(items), plans if any(p is not None for p in plans) else ()
                )
                # on WorkerLost the items stay in inflight[w]: re-issued on replacement
                with contextlib.suppress(WorkerLost):
                    self.backend.send(w, message)
                sent = True
            elif not self.inflight[w] and not self._quiet:
                sent |= self._send_work(w)
        return sent

    def _send_work(self, w: int) -> bool:
        """The sampler's work for idle worker ``w`` (nothing to generate, the stream full)."""
        work = self.sampler.idle_work(w, self.versions[w])
        if work is None:
            return False
        with contextlib.suppress(WorkerLost):  # the pump replaces it: the sampler is told
            self.backend.send(w, SamplerWork(work))
        return True

    def _draw(self) -> Item:
        """The task source's next item, for the sampler (counted in ``drawn``)."""
        item = next(self.items)
        self.drawn += 1
        return item

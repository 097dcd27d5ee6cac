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

Prompt selection (``selector``, :mod:`streamrl.rollout.selection.posterior`) sits where items are
drawn for issue: a skipped item is drawn from the task source (it counts in ``drawn``,
the source's position) but never gets an index, so it is never issued and the stream's
books do not see it. Every backend and a resume share this one path. The likelihood
gate (``candidates``, :mod:`streamrl.rollout.selection.likelihood`) also starts here: each
issued item goes out with further candidates drawn for it, and the candidates a worker
hands back (spares) are drawn again, before the task source, once the trainer has
published the next weight version. With ``score_ahead`` (at η >= 1), a worker that has
nothing left to generate (the stream admits nothing more until the trainer consumes)
scores fresh candidates ahead instead of idling; the accepted ones are issued first,
without scoring again, while their decision is at most ``score_ahead`` versions old.

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
from collections import deque
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
    ScoreAhead,
    ScoredAhead,
    StartItems,
    Stop,
    VersionReport,
)
from streamrl.core.types import Item
from streamrl.rollout.episodes.base import PromptTooLong
from streamrl.rollout.selection.likelihood import CandidateBudget, weighted
from streamrl.rollout.selection.posterior import PromptSelector
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
AHEAD_CHUNK = 64  # candidates per ScoreAhead: about one engine step of prefill rows
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
        selector: PromptSelector | None = None,
        candidates: CandidateBudget | None = None,
        score_ahead: int = 0,
    ) -> None:
        super().__init__()
        self.selector = selector  # None: every drawn item is issued
        self.candidates = candidates  # the likelihood gate's (None: one candidate per item)
        # decisions made ahead stay usable for this many versions (0: off). At η = 0 what an
        # idle worker scores would depend on timing, and so would the decisions: off.
        ahead = candidates is not None and stream.max_staleness >= 1
        self.score_ahead = score_ahead if ahead else 0
        self.backend, self.stream, self.items = backend, stream, items
        self.max_restarts, self.worker_timeout_s = max_restarts, worker_timeout_s
        self.max_consecutive_failures = max_consecutive_failures  # 0: never stop
        self.max_dropped_in_a_row = max_dropped_in_a_row  # equal-reward groups; 0: never
        self.interval_s = getattr(backend, "poll_interval_s", interval_s)
        self.log = logger or logging.getLogger("streamrl.pool")
        n = backend.num_workers
        self.versions: list[int | None] = [None] * n  # acknowledged engine version
        self.inflight: list[dict[int, Item]] = [{} for _ in range(n)]
        self.engine_stats: list[dict] = [{} for _ in range(n)]
        self._last_seen = [time.monotonic()] * n
        self._orphans: list[Item] = []  # items of dead workers, waiting for a new home
        self.drawn = 0  # items taken from the task source (its position, for resume)
        self._items: dict[int, Item] = {}  # issued and not yet ended (pruned at checkpoints)
        self._alternates: dict[int, tuple[Item, ...]] = {}  # the gate's further candidates
        self._respared: set[int] = set()  # items that are spares drawn again
        self._forced: set[int] = set()  # items the gate is not to skip (selection/forced)
        self._spares: deque[Item] = deque()  # handed back by the gate, drawn first
        self._returned: list[tuple[int, tuple[Item, ...]]] = []  # spares until the next publish
        self._ahead: deque[tuple[Item, int]] = deque()  # accepted ahead, at this version
        # the ScoreAhead out at each worker: (batch, items, fresh draws or a refresh)
        self._scoring: list[tuple[int, tuple[Item, ...], bool] | None] = [None] * n
        self._batches = 0  # ScoreAhead commands sent
        self._issued_ahead: set[int] = set()  # items issued on a decision made ahead
        self._quiet = False  # paused: no scoring ahead
        self._latest = self._merged = -1  # the trainer's last version, and the spares' merge
        self._streak, self._streak_first = 0, ""  # failed items in a row, and the first
        self._unwarned, self._last_warn = 0, 0.0
        self._dropped = (0, 0.0, 0)  # groups dropped in a row, their reward sum and samples
        self._too_long = 0  # items filtered in a row: no room in the context for their prompt
        self._last_drop_warn = 0.0
        self._lock = threading.RLock()  # the pump's state: reports, sends, in-flight items
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        if self.selector is not None:  # before any item can be admitted at ``version``
            self.selector.advance(version, self.stream.outstanding_indices())
        self._latest = version  # the pump merges the spares before it admits at it
        self.backend.publish(state_dict, version)

    def _merge_spares(self) -> None:
        """After a publish (under the pump's lock): the spares handed back since the last
        one join the draw queue, in item order, and the gate's bundle size moves."""
        if self._merged == self._latest:
            return
        self._merged = self._latest
        self._spares.extend(self._returned_items())
        self._returned.clear()
        while self._ahead and self._ahead[0][1] < self._latest - self.score_ahead:
            self._spares.append(self._ahead.popleft()[0])  # too old: scored again when issued
            self.candidates.count_ahead("expired")  # type: ignore[union-attr]
        if self.candidates is not None:
            self.candidates.advance()

    def _returned_items(self) -> list[Item]:
        return [it for _, items in sorted(self._returned, key=lambda r: r[0]) for it in items]

    def checkpoint(self) -> tuple[dict, list[tuple[int, str, str]]]:
        """(state, ledger): the stream's books and every issued but unconsumed item, the
        task source's position, the pool's counters and the prompt selector's posterior,
        taken in one atomic step with the stream's ledger of item endings since the last
        drain."""
        with self._lock:
            self._merge_spares()
            state, ledger = self.stream.checkpoint()
            keep = set(state["outstanding"])
            self._items = {i: it for i, it in self._items.items() if i in keep}
            state["items"] = [copy.deepcopy(self._items[i]) for i in sorted(keep)]
            state.update(drawn=self.drawn, restarts=self.restarts, reissued=self.reissued)
            if self.selector is not None:
                state["selection"] = self.selector.state_dict(outstanding=keep)
            if self.candidates is not None:
                self._alternates = {i: a for i, a in self._alternates.items() if i in keep}
                self._respared &= keep
                self._forced &= keep
                self._issued_ahead &= keep
                state["candidates"] = copy.deepcopy(
                    {
                        "budget": self.candidates.state_dict(),
                        "alternates": self._alternates,
                        "respared": sorted(self._respared),
                        "forced": sorted(self._forced),
                        "issued_ahead": sorted(self._issued_ahead),
                        # handed back since the last publish, and scored (or being
                        # scored) ahead, too: drawn, never to be lost
                        "spares": [*self._spares, *self._returned_items(), *self._held_ahead()],
                    }
                )
        return state, ledger

    def _held_ahead(self) -> list[Item]:
        """Candidates accepted ahead, then those a worker is scoring ahead now."""
        out = [item for item, _ in self._ahead]
        return out + [it for sent in self._scoring if sent is not None for it in sent[1]]

    def restore(self, state: dict) -> None:
        """Continue from :meth:`checkpoint`'s state (before :meth:`start`). ``items``
        (the pool's task-source iterator) must already skip the ``drawn`` items."""
        self.stream.restore(state)
        self._orphans = sorted(state["items"], key=lambda it: it.index)
        self._items = {it.index: it for it in self._orphans}
        self.resumed_items += len(self._orphans)
        self.drawn, self.restarts, self.reissued = (
            state["drawn"],
            state["restarts"],
            state["reissued"],
        )
        if self.selector is not None and "selection" in state:
            self.selector.load_state_dict(state["selection"])
        if self.candidates is not None and "candidates" in state:
            gate = state["candidates"]
            self.candidates.load_state_dict(gate["budget"])
            self._alternates = dict(gate["alternates"])
            self._respared = set(gate["respared"])
            self._forced = set(gate["forced"])
            self._issued_ahead = set(gate.get("issued_ahead", ()))
            self._spares = deque(gate["spares"])

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
        """Whether idle workers may score candidates ahead (``selection.score_ahead``). The
        trainer turns it off around evaluations: a worker thread scoring ahead would slow
        them down (the GIL)."""
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
                    self._merge_spares()
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
            elif isinstance(msg, ScoredAhead):
                self._take_scored(w, msg)
            elif isinstance(msg, GroupDone | GroupRejected):
                item = self.inflight[w].pop(msg.item_index, None)
                if item is None:
                    continue  # a late report of an item already re-issued elsewhere
                if self.selector is not None:  # before the stream may end the item
                    self.selector.observe(msg.item_index, item.id, msg.rewards)
                self._gate_report(msg)
                self._add_rollout_stats(msg)
                self._note_failure(msg)
                self._note_dropped(msg)
                if isinstance(msg, GroupDone):
                    self.stream.put(Group(msg.item_index, -1, list(msg.trajectories)))
                    continue
                if msg.detail:  # a failure is an error; a filtered item only says why
                    level = logging.ERROR if msg.outcome == "failed" else logging.DEBUG
                    self.log.log(
                        level, "item %d %s (%s): %s", msg.item_index, msg.outcome, msg.reason,
                        msg.detail,
                    )  # fmt: skip
                self._items.pop(msg.item_index, None)
                self.stream.reject(msg.item_index, msg.outcome, msg.reason)
            else:
                raise TypeError(f"unknown report {msg!r} from rollout worker {w}")
        return bool(reports)

    def _gate_report(self, msg: GroupDone | GroupRejected) -> None:
        """The likelihood gate's part of an ended item: its counters, and its spares kept
        for the next publish."""
        self._alternates.pop(msg.item_index, None)
        self._forced.discard(msg.item_index)
        if msg.item_index in self._issued_ahead:
            self._issued_ahead.discard(msg.item_index)
            if isinstance(msg, GroupRejected) and msg.reason == EQUAL_REWARDS:
                self.candidates.count_ahead("dropped")  # type: ignore[union-attr]
        respared = int(msg.item_index in self._respared)
        self._respared.discard(msg.item_index)
        if self.candidates is not None:
            self.candidates.observe(msg.gate, respared)
        if msg.spares:
            self._returned.append((msg.item_index, msg.spares))

    def _take_scored(self, w: int, msg: ScoredAhead) -> None:
        sent = self._scoring[w]
        if sent is None or sent[0] != msg.batch:
            return  # from a worker replaced since: its candidates are spares already
        self._scoring[w] = None
        kind = "scored" if sent[2] else "rescored"
        self.candidates.observe(msg.outcomes, ahead=kind)  # type: ignore[union-attr]
        self._ahead.extend((item, msg.version) for item in msg.accepted)
        self._spares.extend(msg.unscored)

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
        if self._scoring[w] is not None:  # its candidates scored ahead: not lost
            self._spares.extend(self._scoring[w][1])
            self._scoring[w] = None
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
                    ahead = bool(self._ahead)
                    spare = not ahead and bool(self._spares)
                    item = self._ahead.popleft()[0] if ahead else self._draw()
                    item.index = index
                    self._items[index] = item
                    if ahead:  # accepted ahead: generated without scoring it again
                        self._issued_ahead.add(index)
                        self.candidates.count_ahead("issued")  # type: ignore[union-attr]
                    elif spare:  # the gate accepted it last version: usually does again
                        self._respared.add(index)
                    elif self.candidates is not None and self.candidates.force_next():
                        self._forced.add(index)
                    elif self.candidates is not None and self.candidates.size > 1:
                        more = self.candidates.size - 1
                        self._alternates[index] = tuple(self._draw_fresh() for _ in range(more))
                    items.append(item)
            if items:
                for item in items:
                    self.inflight[w][item.index] = item
                alternates = tuple(self._alternates.get(it.index, ()) for it in items)
                forced = tuple(it.index for it in items if self._ungated(it.index))
                message = StartItems(tuple(items), alternates if any(alternates) else (), forced)
                # on WorkerLost the items stay in inflight[w]: re-issued on replacement
                with contextlib.suppress(WorkerLost):
                    self.backend.send(w, message)
                sent = True
            elif not self.inflight[w] and self._scoring[w] is None:
                sent |= self._send_score_ahead(w)
        return sent

    def _ungated(self, index: int) -> bool:
        """Generated without the gate: forced (selection/forced) or decided ahead."""
        return index in self._forced or index in self._issued_ahead

    def _send_score_ahead(self, w: int) -> bool:
        """An idle worker (nothing to generate, the stream full) scores fresh candidates
        ahead, until enough are accepted for ``score_ahead`` batches; then it scores the
        oldest decisions again, at its newer weights, so the held ones stay fresh."""
        if not self.score_ahead or self._quiet:
            return False
        want = self.score_ahead * self.stream.items_per_batch - len(self._ahead)
        if want > 0:
            accept_rate = max(0.1, 1.0 - self.candidates.skip_rate)  # type: ignore[union-attr]
            n = min(AHEAD_CHUNK, math.ceil(want / accept_rate))
            items, fresh = tuple(self._draw_fresh() for _ in range(n)), True
        else:
            old: list[Item] = []
            while self._ahead and self._ahead[0][1] < self.versions[w] and len(old) < AHEAD_CHUNK:
                old.append(self._ahead.popleft()[0])
            if not old:
                return False
            items, fresh = tuple(old), False
        self._batches += 1
        self._scoring[w] = (self._batches, items, fresh)
        with contextlib.suppress(WorkerLost):  # replaced by the pump: the items become spares
            self.backend.send(w, ScoreAhead(self._batches, items))
        return True

    def _draw(self) -> Item:
        """The next spare the gate handed back (an item of its own, no alternates), else
        the next item of the task source the selector accepts (skipped ones are drawn,
        counted in ``selection/skipped``, and never issued). A spare is decided again, so
        it loses any importance weight of an earlier decision (one made ahead, expired)."""
        return weighted(self._spares.popleft(), None) if self._spares else self._draw_fresh()

    def _draw_fresh(self) -> Item:
        while True:
            item = next(self.items)
            self.drawn += 1
            if self.selector is None or self.selector.accept(item):
                return item

"""The sample stream: admission control, staleness bound, group assembly, accounting.

Producers (rollout workers) ask for admission before they start a group, then put
the finished group or report why it was rejected. The consumer (trainer) takes
fixed-size batches of groups. The unit of admission and accounting is one *item*:
a prompt rolled out ``group_size`` times.

Staleness bound (eta = ``max_staleness``), B = groups per batch:

* Admission (AReaL's capacity rule). An item may start at engine weight version
  ``e`` only while ``consumed + outstanding < (e + eta + 1) * B``, where
  ``outstanding`` counts admitted items not yet consumed or rejected. Hence, for
  any version u, at most ``(u + eta + 1) * B`` eventually-consumed items are ever
  admitted at versions <= u.
* Consumption. The batch for trainer version v must contain every outstanding
  item admitted at version <= v - eta (the consumer waits for them); the rest is
  filled with ready items, oldest first. Invariant P(v): at trainer version v, for
  every admit version u, at most ``(u + eta + 1 - v) * B`` items admitted at
  versions <= u are outstanding. Admission keeps P (an item admitted at e <= u
  found ``consumed + outstanding < (e + eta + 1) * B`` with ``consumed = v * B``).
  The consumer only takes a batch after which P(v + 1) holds (``_keeps_bound``;
  otherwise it waits for older items to finish, and the B oldest always qualify).
  P(v) at u = v - eta says at most B items are forced, so they fit.

Every generated token of an item has version >= its admission version, so by
induction no consumed token is more than eta versions older than the trainer.
eta = 0 admits exactly one batch per version: synchronous on-policy training.

Accounting: each issued item ends exactly once as consumed, filtered (reason) or
failed (reason); ``close()`` labels whatever is still outstanding as
``filtered: run_ended``. ``check_accounting`` asserts the books balance. Every
ending is also written to a ledger (``drain_ledger``), so a run can prove per item
that nothing was lost or counted twice, across crashes and resumes.

Checkpoints. ``checkpoint()`` returns the books and the outstanding item indices,
and drains the ledger, in one atomic step; ``restore(state)`` continues from them:
the outstanding items are issued again (same index, same sampling seeds) at the
trainer's version, which only loosens the bound's invariant P.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from streamrl.core.sample import Sample


class StreamClosed(RuntimeError):
    """Raised to producers/consumers blocked on a stream that was closed."""


@dataclass
class Group:
    """The finished samples of one item (trajectories, segments or transitions)."""

    item_index: int
    admit_version: int
    trajectories: list[Sample]

    @property
    def min_version(self) -> int:
        versions = [t.min_version for t in self.trajectories if t.num_generated]
        return min(versions) if versions else self.admit_version


@dataclass
class StreamStats:
    issued: int = 0
    consumed: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def as_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {
            "stream/issued": self.issued,
            "stream/consumed": self.consumed,
            "stream/filtered": sum(self.filtered.values()),
            "stream/failed": sum(self.failed.values()),
        }
        out.update({f"stream/filtered/{k}": v for k, v in self.filtered.items()})
        out.update({f"stream/failed/{k}": v for k, v in self.failed.items()})
        return out


class SampleStream:
    """Thread-safe stream of item groups between producers and one consumer."""

    def __init__(self, items_per_batch: int, max_staleness: int, max_inflight: int | None = None):
        # (train.items_per_step >= 1 and stream.max_staleness >= 0: the config's checks)
        self.items_per_batch = items_per_batch
        self.max_staleness = max_staleness
        self.max_inflight = max_inflight
        self.stats = StreamStats()
        self._cond = threading.Condition()
        self._trainer_version = 0
        self._outstanding: dict[int, int] = {}  # item index -> admit version
        self._ready: dict[int, Group] = {}
        self._ledger: list[tuple[int, str, str]] = []  # (item, outcome, reason), in order
        self._closed = False

    # ------------------------------------------------------------ producers

    def capacity(self, engine_version: int) -> int:
        """How many more items may start now with weights of ``engine_version``."""
        with self._cond:
            return self._capacity(engine_version)

    def _capacity(self, engine_version: int) -> int:
        limit = (engine_version + self.max_staleness + 1) * self.items_per_batch
        free = limit - self.stats.consumed - len(self._outstanding)
        if self.max_inflight is not None:
            in_flight = len(self._outstanding) - len(self._ready)
            free = min(free, self.max_inflight - in_flight)
        return max(0, free)

    def admit(self, engine_version: int, max_items: int, timeout: float | None = None) -> list[int]:
        """Reserve up to ``max_items`` item indices to start at ``engine_version``.

        Blocks until at least one is available (or ``timeout`` passes: returns []).
        The caller must later ``put`` or ``reject`` every returned index.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise StreamClosed("stream closed")
                n = min(max_items, self._capacity(engine_version))
                if n > 0:
                    first = self.stats.issued
                    self.stats.issued += n
                    for i in range(first, first + n):
                        self._outstanding[i] = engine_version
                    return list(range(first, first + n))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)

    def put(self, group: Group) -> None:
        """A finished group, ready to be consumed."""
        with self._cond:
            self._check_outstanding(group.item_index)
            if group.item_index in self._ready:
                raise ValueError(f"item {group.item_index} was put twice")
            group.admit_version = self._outstanding[group.item_index]
            self._ready[group.item_index] = group
            self._cond.notify_all()

    def reject(self, index: int, outcome: str, reason: str) -> None:
        """An item that will never be consumed: ``outcome`` is 'filtered' or 'failed'."""
        if outcome not in ("filtered", "failed"):
            raise ValueError(f"outcome must be 'filtered' or 'failed', got {outcome!r}")
        with self._cond:
            self._check_outstanding(index)
            if index in self._ready:
                raise ValueError(f"item {index} is already ready; cannot reject it")
            del self._outstanding[index]
            getattr(self.stats, outcome)[reason] += 1
            self._ledger.append((index, outcome, reason))
            self._cond.notify_all()

    def _check_outstanding(self, index: int) -> None:
        if self._closed:  # already accounted as filtered: run_ended
            raise StreamClosed("stream closed")
        if index not in self._outstanding:
            raise ValueError(f"item {index} is not outstanding (never admitted or already done)")

    # ------------------------------------------------------------ consumer

    @property
    def trainer_version(self) -> int:
        return self._trainer_version

    def set_trainer_version(self, version: int) -> None:
        with self._cond:
            if version < self._trainer_version:
                raise ValueError("trainer version cannot go backwards")
            self._trainer_version = version
            self._cond.notify_all()

    def get_batch(self, timeout: float | None = None) -> list[Group] | None:
        """Take B groups for the trainer's current version (None on timeout).

        Groups come back sorted by item index, so the batch order does not depend
        on which episode finished first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        b = self.items_per_batch
        with self._cond:
            while True:
                if self._closed:
                    raise StreamClosed("stream closed")
                chosen = self._choose()
                if chosen is not None:
                    groups = [self._ready.pop(i) for i in chosen]
                    for i in chosen:
                        del self._outstanding[i]
                        self._ledger.append((i, "consumed", ""))
                    self.stats.consumed += b
                    self._cond.notify_all()
                    return groups
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def has_batch(self) -> bool:
        """Whether :meth:`get_batch` would return a batch now."""
        with self._cond:
            return self._closed or self._choose() is not None

    def _choose(self) -> list[int] | None:
        """The items of the next batch, sorted, if one can be taken now (hold the lock)."""
        b = self.items_per_batch
        oldest_allowed = self._trainer_version - self.max_staleness
        forced = [i for i, v in self._outstanding.items() if v <= oldest_allowed]
        if len(forced) > b:  # impossible if producers respect capacity()
            raise AssertionError(f"{len(forced)} items would exceed the staleness bound")
        if not all(i in self._ready for i in forced) or len(self._ready) < b:
            return None
        forced_set = set(forced)
        rest = sorted(
            (i for i in self._ready if i not in forced_set),
            key=lambda i: (self._outstanding[i], i),
        )
        chosen = sorted(forced + rest[: b - len(forced)])
        return chosen if self._keeps_bound(set(chosen)) else None

    def _keeps_bound(self, chosen: set[int]) -> bool:
        """After consuming ``chosen`` (trainer goes v -> v+1), every admit version u
        must have at most (u + eta - v) * B items at versions <= u left outstanding,
        or some later batch would have more than B forced items. Taking newer ready
        items while older ones still generate can break this; then the consumer
        waits for the older ones instead."""
        left = Counter(u for i, u in self._outstanding.items() if i not in chosen)
        total = 0
        for u in sorted(left):
            total += left[u]
            if total > (u + self.max_staleness - self._trainer_version) * self.items_per_batch:
                return False
        return True

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop the stream; outstanding items are accounted as filtered: run_ended."""
        with self._cond:
            if self._closed:
                return
            for i in self._outstanding:
                self.stats.filtered["run_ended"] += 1
                self._ledger.append((i, "filtered", "run_ended"))
            self._outstanding.clear()
            self._ready.clear()
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def drain_ledger(self) -> list[tuple[int, str, str]]:
        """Item endings since the last drain: (item index, outcome, reason)."""
        with self._cond:
            out, self._ledger = self._ledger, []
            return out

    def checkpoint(self) -> tuple[dict, list[tuple[int, str, str]]]:
        """(the books and outstanding items, the drained ledger), atomically."""
        with self._cond:
            s = self.stats
            state = {
                "issued": s.issued,
                "consumed": s.consumed,
                "filtered": dict(s.filtered),
                "failed": dict(s.failed),
                "trainer_version": self._trainer_version,
                "outstanding": sorted(self._outstanding),
            }
            out, self._ledger = self._ledger, []
            return state, out

    def restore(self, state: dict) -> None:
        """Continue from ``checkpoint()``'s state; its outstanding items are admitted
        again at the trainer's version (the caller re-issues them)."""
        with self._cond:
            if self.stats.issued or self._outstanding:
                raise RuntimeError("restore() needs a fresh stream")
            self.stats = StreamStats(
                state["issued"],
                state["consumed"],
                Counter(state["filtered"]),
                Counter(state["failed"]),
            )
            self._trainer_version = state["trainer_version"]
            self._outstanding = {i: self._trainer_version for i in state["outstanding"]}

    def outstanding(self) -> int:
        with self._cond:
            return len(self._outstanding)

    def outstanding_indices(self) -> set[int]:
        """The items issued and not yet ended (ready ones included)."""
        with self._cond:
            return set(self._outstanding)

    def check_accounting(self) -> None:
        """Every issued item is consumed, filtered, failed, or still outstanding."""
        with self._cond:
            s = self.stats
            done = s.consumed + sum(s.filtered.values()) + sum(s.failed.values())
            if done + len(self._outstanding) != s.issued:
                raise AssertionError(
                    f"accounting mismatch: issued={s.issued} consumed={s.consumed} "
                    f"filtered={dict(s.filtered)} failed={dict(s.failed)} "
                    f"outstanding={len(self._outstanding)}"
                )


def staleness_metrics(groups: list[Group], trainer_version: int) -> dict[str, float]:
    """min/mean/max of (trainer version - oldest token version) over a batch, and
    how many groups had each lag."""
    lags = [trainer_version - g.min_version for g in groups]
    out = {
        "staleness/min": float(min(lags)),
        "staleness/mean": sum(lags) / len(lags),
        "staleness/max": float(max(lags)),
    }
    for lag in set(lags):  # the distribution: groups consumed at each lag
        out[f"staleness/groups_at_lag_{lag}"] = float(lags.count(lag))
    return out


def carried_metrics(groups: list[Group]) -> dict[str, float]:
    """Tokens generated under an older version than their sequence's last token.

    Those are the tokens a weight update interrupted and carried over (partial
    rollouts, interruptible generation) instead of throwing them away.
    """
    carried, mixed = 0, 0
    for g in groups:
        for t in g.trajectories:
            v = t.versions[t.loss_mask]
            if v.numel():
                older = int((v < v.max()).sum())
                carried += older
                mixed += older > 0
    return {"rollout/carried_tokens": float(carried), "rollout/multi_version_samples": float(mixed)}

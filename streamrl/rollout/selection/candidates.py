"""How many candidates the likelihood gate gets per issued item, and the ``selection/*``
counters of what became of them (:mod:`streamrl.rollout.selection.likelihood`)."""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any

# the chance, at the recent skip rate, that every candidate of an item is skipped
MISS_PROBABILITY = 0.1


def candidates_for(skip_rate: float, cap: int) -> int:
    """How many candidates an item gets so that all are skipped with probability at most
    ``MISS_PROBABILITY``, if each is skipped independently at ``skip_rate``: the least k
    with skip_rate^k <= MISS_PROBABILITY, at most ``cap``.

    >>> [candidates_for(r, 64) for r in (0.0, 0.1, 0.3, 0.5, 0.9, 0.93, 1.0)]
    [1, 1, 2, 4, 22, 32, 64]
    """
    if skip_rate <= MISS_PROBABILITY:
        return 1
    if skip_rate >= 1.0:
        return cap
    k = math.ceil(math.log(MISS_PROBABILITY) / math.log(skip_rate) - 1e-9)
    return max(1, min(cap, k))


class CandidateBudget:
    """The rollout pool's side of the gate: how many candidates each issued item gets and
    the ``selection/*`` counters of what the workers made of them (thread-safe).

    Reports are taken as they arrive (``observe``); the skip rate behind the bundle size
    moves only at :meth:`advance`, when the trainer publishes weights, to the share of
    fresh candidates skipped since the previous publish. At η = 0 every item issued at a version
    has ended before the next publish, so the sizes do not depend on timing.
    """

    def __init__(self, max_candidates: int, max_skips_in_a_row: int = 100) -> None:
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.max_candidates, self.max_skips_in_a_row = max_candidates, max_skips_in_a_row
        self.in_a_row = self.forced = 0  # candidates skipped since one was generated
        self.skip_rate = 0.0  # of fresh candidates, scored between the last two publishes
        self.size = 1
        self.scored = self.spares = self.spares_reskipped = 0
        self.skipped: Counter[str] = Counter()
        self.ahead: Counter[str] = Counter()  # score-ahead: scored, issued, expired, dropped
        self._window = [0, 0]  # candidates scored, skipped since the last advance
        self._lock = threading.Lock()

    def observe(
        self, outcomes: list[str] | tuple[str, ...], respared: int = 0, ahead: str = ""
    ) -> None:
        """An item ended; ``outcomes`` says what became of each of its candidates (see
        :class:`Choice`), the first ``respared`` of which were spares drawn again. The skip
        rate counts only the fresh ones: a spare was accepted before and mostly is again,
        so it says little about how often a new draw is skipped. ``ahead``: candidates
        scored ahead instead (:meth:`.gate.LikelihoodGate.score_ahead`), ``scored`` (fresh draws)
        or ``rescored`` (decisions made ahead, made again at newer weights)."""
        with self._lock:
            self.scored += len(outcomes)
            if ahead:
                self.ahead[ahead] += len(outcomes)
                respared = len(outcomes) if ahead == "rescored" else 0
            self.spares += outcomes.count("spare")
            skips = [o for o in outcomes if o.startswith("predicted")]
            self.skipped.update(skips)
            reskipped = sum(o.startswith("predicted") for o in outcomes[:respared])
            if ahead == "rescored":
                self.ahead["reskipped"] += reskipped
            elif not ahead:
                self.spares_reskipped += reskipped
            fresh = outcomes[respared:]
            self._window[0] += len(fresh)
            self._window[1] += sum(o.startswith("predicted") for o in fresh)
            generated = "chosen" in outcomes or "accepted" in outcomes
            self.in_a_row = 0 if generated else self.in_a_row + len(skips)

    def count_ahead(self, event: str, n: int = 1) -> None:
        """A score-ahead event: ``issued`` on an earlier decision, ``expired`` (too old,
        scored again when issued) or ``dropped`` (issued ahead, then filtered by the
        algorithm: how often a decision made ahead was wrong)."""
        with self._lock:
            self.ahead[event] += n

    def force_next(self) -> bool:
        """Whether the next item is to be generated without the gate: more than
        ``max_skips_in_a_row`` candidates were skipped since any was generated, so that a
        gate that skips everything (a mastered task, or ``skip_all_wrong`` on a policy
        that answers in another format) cannot stall the run. Counted in
        ``selection/forced``. The count follows the order reports arrive in, so which
        item is forced can differ between two η = 0 runs (only where one is forced)."""
        with self._lock:
            if self.in_a_row < self.max_skips_in_a_row:
                return False
            self.in_a_row, self.forced = 0, self.forced + 1
            return True

    def advance(self) -> None:
        with self._lock:
            scored, skipped = self._window
            if scored:
                self.skip_rate = skipped / scored
                self.size = candidates_for(self.skip_rate, self.max_candidates)
            self._window = [0, 0]

    def metrics(self) -> dict[str, float]:
        """``selection/scored`` candidates, ``selection/skipped`` (also by reason),
        ``selection/spares`` handed back and ``selection/spares_reskipped`` (skipped when
        drawn again), ``selection/forced`` items generated without the gate (see
        :meth:`force_next`), and the current ``selection/skip_rate`` of fresh candidates
        and ``selection/candidates`` per issued item; with ``selection.score_ahead``,
        ``selection/ahead/{scored,rescored,reskipped,issued,expired,dropped}`` (see
        :meth:`observe` and :meth:`count_ahead`)."""
        with self._lock:
            out = {
                "selection/scored": float(self.scored),
                "selection/skipped": float(sum(self.skipped.values())),
                "selection/spares": float(self.spares),
                "selection/spares_reskipped": float(self.spares_reskipped),
                "selection/forced": float(self.forced),
                "selection/skip_rate": self.skip_rate,
                "selection/candidates": float(self.size),
            }
            out.update({f"selection/skipped/{k}": float(v) for k, v in self.skipped.items()})
            out.update({f"selection/ahead/{k}": float(v) for k, v in self.ahead.items()})
            return out

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "skip_rate": self.skip_rate,
                "size": self.size,
                "counters": [self.scored, self.spares, self.spares_reskipped, dict(self.skipped)],
                "forced": [self.in_a_row, self.forced],
                "window": list(self._window),
                "ahead": dict(self.ahead),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.skip_rate, self.size = state["skip_rate"], state["size"]
            self.scored, self.spares, self.spares_reskipped, skipped = state["counters"]
            self.skipped = Counter(skipped)
            self._window = list(state["window"])
            self.in_a_row, self.forced = state["forced"]
            self.ahead = Counter(state.get("ahead", {}))

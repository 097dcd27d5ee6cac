"""Difficulty-aware prompt selection: skip a prompt before generating it when its group is
predicted to come out all-equal (all correct or all wrong), which GRPO learns nothing from
and dynamic sampling would generate, score and drop (MoPPS / VADE-style).

Model. Each prompt (keyed by ``Item.id``) has a Beta(a, b) posterior over its success
rate p, starting from the prior Beta(a0, b0). A finished group of G samples adds its
successes (reward > ``success_threshold``: binary outcomes, so for 0/1 rewards "all equal"
is exactly dynamic sampling's zero reward variance) to a and its failures to b. Evidence
decays toward the prior: evidence k trainer steps old weighs ``decay**k``.

Decision. The chance that a group of G is all-equal is, in closed form,

    P(all equal) = E[p^G + (1-p)^G] = B(a+G, b)/B(a, b) + B(a, b+G)/B(a, b)
                 = prod_{k<G} (a+k)/(a+b+k) + prod_{k<G} (b+k)/(a+b+k).

An item is skipped when that exceeds ``threshold``. A prompt never seen is always issued
(under Beta(1, 1) its P(all equal) is 2/(G+1), low), and after ``max_skips_in_a_row``
skips the next item is issued anyway, so selection can never stall a source.

Determinism (η = 0 is bit-exact, also across a resume). The pump thread records each
group's outcome as *pending*; the posterior takes the pending outcomes in one step when
the trainer publishes a new weight version, in item-index order, and only those of items
that have ended (consumed or rejected). At η = 0 every item issued so far has ended by
then, so the posterior a decision sees does not depend on timing. A checkpoint keeps the
pending outcomes of ended items and drops those of outstanding ones: those items are
issued again after a resume and report the same outcome again, counted once.

>>> sel = PromptSelector(group_size=4)
>>> sel.observe(0, "q", [1.0, 1.0, 0.0])
>>> sel.advance(1, outstanding=set())
>>> sel.posterior("q")
(3.0, 2.0)
>>> from fractions import Fraction
>>> all_equal_probability(Fraction(3), Fraction(2), 4)
Fraction(2, 7)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from streamrl.core.types import Item
from streamrl.rollout.selection.base import GroupSampler, Report, SamplerContext, SamplerSetup
from streamrl.rollout.selection.draws import Draws, independent
from streamrl.rollout.selection.registry import register_sampler


def all_equal_probability(a: Any, b: Any, group_size: int) -> Any:
    """P(all ``group_size`` Bernoulli(p) outcomes are equal) with p ~ Beta(a, b).

    Works on floats and on :class:`fractions.Fraction` (exact). Beta(1, 1), G = 8: 2/9.

    >>> round(all_equal_probability(1.0, 1.0, 8), 6) == round(2 / 9, 6)
    True
    """
    all_success = all_failure = 1
    for k in range(group_size):
        all_success *= (a + k) / (a + b + k)
        all_failure *= (b + k) / (a + b + k)
    return all_success + all_failure


class PromptSelector:
    """The per-prompt posteriors, the skip decision and its counters (thread-safe).

    ``accept`` runs where items are issued (the rollout pool's pump), ``observe`` where
    groups are reported, ``advance`` when the trainer publishes weights (see the module
    docstring for why the posterior moves only then).
    """

    def __init__(
        self,
        group_size: int,
        *,
        prior_alpha: float = 1.0,
        prior_beta: float = 1.0,
        threshold: float = 0.5,
        decay: float = 1.0,
        success_threshold: float = 0.5,
        max_skips_in_a_row: int = 100,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.prior = (prior_alpha, prior_beta)
        self.threshold, self.decay = threshold, decay
        self.success_threshold = success_threshold
        self.max_skips_in_a_row = max_skips_in_a_row
        self.version = 0  # the trainer version the posterior is up to date with
        # prompt key -> (successes, failures, version of the last update); decayed lazily
        self._evidence: dict[str, tuple[float, float, int]] = {}
        self._pending: dict[int, tuple[str, int, int]] = {}  # item index -> (key, succ, fail)
        self.skipped = self.forced = self.issued = self.observed = 0
        self.predicted_all_equal = 0.0  # sum of P(all equal) over issued items
        self._in_a_row = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the posterior

    def posterior(self, key: str) -> tuple[float, float]:
        """The current Beta(a, b) of prompt ``key`` (the prior if never observed)."""
        with self._lock:
            return self._posterior(key)

    def _posterior(self, key: str) -> tuple[float, float]:
        a0, b0 = self.prior
        if key not in self._evidence:
            return a0, b0
        s, f, at = self._evidence[key]
        w = self.decay ** (self.version - at)
        return a0 + w * s, b0 + w * f

    def p_all_equal(self, key: str) -> float:
        """Predicted P(a group of ``group_size`` samples of ``key`` is all-equal)."""
        with self._lock:
            return float(all_equal_probability(*self._posterior(key), self.group_size))

    # ------------------------------------------------------------ decisions and outcomes

    def accept(self, item: Item) -> bool:
        """Whether to issue ``item`` (False: skip it, counted in ``selection/skipped``)."""
        with self._lock:
            seen = item.id in self._evidence
            p = float(all_equal_probability(*self._posterior(item.id), self.group_size))
            if seen and p > self.threshold:
                if self._in_a_row < self.max_skips_in_a_row:
                    self._in_a_row += 1
                    self.skipped += 1
                    return False
                self.forced += 1
            self._in_a_row = 0
            self.issued += 1
            self.predicted_all_equal += p
            return True

    def observe(self, index: int, key: str, rewards: Iterable[float]) -> None:
        """Item ``index`` (prompt ``key``) finished with these per-sample rewards; taken
        into the posterior at the next :meth:`advance` after the item ends."""
        rewards = list(rewards)
        if not rewards:  # failed or rejected before scoring: no evidence
            return
        successes = sum(r > self.success_threshold for r in rewards)
        with self._lock:  # a re-issued item reports again: same index, counted once
            self._pending[index] = (key, successes, len(rewards) - successes)

    def advance(self, version: int, outstanding: set[int]) -> None:
        """The trainer published ``version``: take in the pending outcomes of items not in
        ``outstanding`` (they ended), in item order."""
        with self._lock:
            self.version = version
            for index in sorted(i for i in self._pending if i not in outstanding):
                key, s, f = self._pending.pop(index)
                old_s, old_f, at = self._evidence.get(key, (0.0, 0.0, version))
                w = self.decay ** (version - at)
                self._evidence[key] = (w * old_s + s, w * old_f + f, version)
                self.observed += 1

    # ------------------------------------------------------------ metrics and checkpoints

    def metrics(self) -> dict[str, float]:
        """Cumulative counters: ``selection/skipped`` items never issued, ``forced`` issued
        after max_skips_in_a_row, ``prompts`` with evidence, ``groups_observed``, and
        ``predicted_all_equal``, the expected all-equal groups among the issued items (to
        compare with the groups dynamic sampling dropped)."""
        with self._lock:
            return {
                "selection/skipped": float(self.skipped),
                "selection/forced": float(self.forced),
                "selection/issued": float(self.issued),
                "selection/prompts": float(len(self._evidence)),
                "selection/groups_observed": float(self.observed),
                "selection/predicted_all_equal": self.predicted_all_equal,
            }

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        """Everything to continue; pending outcomes of ``outstanding`` items are left out
        (those items are issued again after a resume and report again)."""
        with self._lock:
            return {
                "version": self.version,
                "evidence": dict(self._evidence),
                "pending": {i: p for i, p in self._pending.items() if i not in outstanding},
                "counters": [self.skipped, self.forced, self.issued, self.observed],
                "predicted_all_equal": self.predicted_all_equal,
                "in_a_row": self._in_a_row,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.version = state["version"]
            self._evidence = dict(state["evidence"])
            self._pending = dict(state["pending"])
            self.skipped, self.forced, self.issued, self.observed = state["counters"]
            self.predicted_all_equal = state["predicted_all_equal"]
            self._in_a_row = state["in_a_row"]


@register_sampler("posterior")
class PosteriorSampler(GroupSampler):
    """``selection.kind: posterior``: the pool skips a drawn item whose group the
    selector predicts all-equal (it never gets an index; the source's position counts
    it), learns from every finished group, and moves the posterior at each publish."""

    def __init__(self, selector: PromptSelector, draws: Draws = independent) -> None:
        super().__init__(draws)
        self.selector = selector

    @classmethod
    def build(cls, setup: SamplerSetup) -> PosteriorSampler:
        sel = setup.selection
        selector = PromptSelector(
            setup.group_size,
            prior_alpha=sel.prior_alpha,
            prior_beta=sel.prior_beta,
            threshold=sel.threshold,
            decay=sel.decay,
            success_threshold=sel.success_threshold,
            max_skips_in_a_row=sel.max_skips_in_a_row,
        )
        return cls(selector, setup.draws)

    @classmethod
    def check(cls, run: SamplerContext) -> None:
        """The threshold lies above the prior's own P(all equal): otherwise a prompt seen
        once could never come back, however far its evidence decayed."""
        sel, g = run.selection, run.rollout.group_size
        prior = all_equal_probability(sel.prior_alpha, sel.prior_beta, g)
        if sel.threshold <= prior:
            raise ValueError(
                f"selection.threshold={sel.threshold} must be above {prior:.4f}, the prior "
                f"Beta({sel.prior_alpha}, {sel.prior_beta})'s P(all {g} samples equal) "
                "(rollout.group_size): a skipped prompt could never come back"
            )

    def issue(self, index: int) -> Item:
        """The next drawn item the selector accepts (skipped ones are drawn, counted in
        ``selection/skipped``, and never issued)."""
        while True:
            item = self.source.draw()
            if self.selector.accept(item):
                return item

    def finished(self, item: Item, report: Report) -> None:
        self.selector.observe(report.item_index, item.id, report.rewards)

    def published(self, version: int, outstanding: set[int]) -> None:
        self.selector.advance(version, outstanding)

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        return self.selector.state_dict(outstanding=outstanding)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selector.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.selector.metrics()

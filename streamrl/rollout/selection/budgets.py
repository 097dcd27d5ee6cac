"""Per-prompt rollout budgets (DARS-style): how many samples each item's group gets.

A group teaches GRPO something only when its samples disagree, which is likeliest for a
prompt whose success rate p is near 1/2 and least likely for one the policy always
solves or never does. Each item's budget follows its *boundary weight*

    w = E[4 p (1 - p)] = 4 a b / ((a + b) (a + b + 1))   for p ~ Beta(a, b),

1 at a certain p = 1/2, 0 at a certain p of 0 or 1, lower under uncertainty. The Beta of
a prompt (keyed by its item id) starts from its task level's measured success rate r as
Beta(k r, k (1 - r)) (k = ``prior_strength``; r = 1/2 before anything is measured), and
its own finished groups add their successes and failures (taken at weight publishes, in
item order, like :mod:`streamrl.rollout.selection.posterior`'s posterior, whose
bookkeeping this reuses).

The budget is ``round(G * w / w_bar)`` clipped to [``min_samples``, ``max_samples``],
with G = ``rollout.group_size`` and w_bar a moving average of the weights of the items
issued so far: the same number of samples per item on average as without budgets (up to
the clipping), spent where the signal is. With every item alike every budget is G.

Admission is unchanged: the stream admits, bounds and accounts *items*, so
``items_per_batch`` and the staleness bound hold as they are; only the number of samples
in a batch varies, within ``items_per_batch * [min_samples, max_samples]``. The budget
travels in the item's metadata (``selection_samples``), so an item issued again (a lost
worker, a resume) gets the same budget and the same sampling seeds.

>>> round(boundary_weight(1.0, 1.0), 4), round(boundary_weight(50.0, 50.0), 4)
(0.6667, 0.9901)
"""

from __future__ import annotations

import threading
from typing import Any

from streamrl.core.types import Item
from streamrl.rollout.selection.posterior import PromptSelector

BUDGET_KEY = "selection_samples"  # item.metadata: the samples its group gets


def boundary_weight(a: float, b: float) -> float:
    """E[4 p (1 - p)] for p ~ Beta(a, b): how close to the success boundary a prompt is."""
    return 4.0 * a * b / ((a + b) * (a + b + 1.0))


def budget_of(item: Item, group_size: int) -> int:
    """The samples ``item``'s group gets: its budget, or ``group_size`` without one."""
    return int(item.metadata.get(BUDGET_KEY, group_size))


class RolloutBudgets:
    """Each item's budget from its prompt's evidence and its task level's success rate
    (see the module docstring); thread-safe."""

    def __init__(
        self,
        group_size: int,
        *,
        min_samples: int = 2,
        max_samples: int = 16,
        prior_strength: float = 4.0,
        smoothing: float = 0.05,
        success_threshold: float = 0.5,
    ) -> None:
        self.group_size, self.min_samples, self.max_samples = group_size, min_samples, max_samples
        self.prior_strength, self.smoothing = prior_strength, smoothing
        # per-prompt successes and failures (a zero prior: the level's rate is the prior)
        self.evidence = PromptSelector(
            group_size, prior_alpha=0.0, prior_beta=0.0, success_threshold=success_threshold
        )
        self.mean_weight: float | None = None
        self.items = self.samples = 0
        self._lock = threading.Lock()

    def weight(self, key: str, rate: float | None) -> float:
        """The boundary weight of prompt ``key`` given its task level's success rate."""
        r = 0.5 if rate is None else min(max(rate, 0.0), 1.0)
        s, f = self.evidence.posterior(key)
        k = self.prior_strength
        return boundary_weight(k * r + s + 1e-9, k * (1.0 - r) + f + 1e-9)

    def assign(self, item: Item, rate: float | None) -> int:
        """Give ``item`` its budget (in its metadata) and count it."""
        w = self.weight(item.id, rate)
        with self._lock:
            m = w if self.mean_weight is None else self.mean_weight
            self.mean_weight = m = (1.0 - self.smoothing) * m + self.smoothing * w
            raw = self.group_size * w / m if m > 0 else float(self.group_size)
            n = min(self.max_samples, max(self.min_samples, round(raw)))
            self.items += 1
            self.samples += n
        item.metadata[BUDGET_KEY] = n
        return n

    def observe(self, index: int, key: str, rewards: list[float]) -> None:
        self.evidence.observe(index, key, rewards)

    def advance(self, version: int, outstanding: set[int]) -> None:
        self.evidence.advance(version, outstanding)

    def metrics(self) -> dict[str, float]:
        """``budgets/items`` given a budget and ``budgets/samples_mean``, their mean."""
        with self._lock:
            if not self.items:
                return {}
            return {
                "budgets/items": float(self.items),
                "budgets/samples_mean": self.samples / self.items,
            }

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        with self._lock:
            counts = [self.items, self.samples, self.mean_weight]
        return {"evidence": self.evidence.state_dict(outstanding), "counts": counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evidence.load_state_dict(state["evidence"])
        with self._lock:
            self.items, self.samples, self.mean_weight = state["counts"]

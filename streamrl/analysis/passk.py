"""Unbiased pass@k and avg@k estimators for sampled evaluations.

Each evaluation item is answered ``n`` times; ``c`` of the answers are correct.

- pass@k: the probability that at least one of ``k`` answers drawn without replacement
  from the ``n`` is correct. The unbiased estimator (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code") is ``1 - C(n-c, k) / C(n, k)``. The binomials
  overflow floats for large ``n`` (C(1000, 500) ~ 1e299), so we compute the ratio in
  exact integer arithmetic and round once: no overflow, no cancellation.
- avg@k: the expected fraction of correct answers among ``k`` samples. Its unbiased
  estimate from ``n >= k`` samples is ``c / n`` (the mean over all samples has the same
  expectation as the mean over any ``k`` of them, and lower variance).

Both are averaged over items (macro average: each item weighs the same).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

__all__ = ["avg_at_k", "pass_at_k", "pass_at_k_per_item", "summarize_outcomes"]


def _check(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"need at least one sample per item, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"number correct c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]: cannot estimate pass@{k} from {n} samples")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one item with ``c`` correct out of ``n`` samples.

    >>> pass_at_k(5, 2, 1)
    0.4
    >>> pass_at_k(5, 2, 2)
    0.7
    """
    _check(n, c, k)
    if n - c < k:  # every size-k subset contains a correct sample
        return 1.0
    # Exact rational, rounded once to the nearest float (Python ints never overflow).
    total = math.comb(n, k)
    return float(Fraction(total - math.comb(n - c, k), total))


def avg_at_k(n: int, c: int, k: int) -> float:
    """Unbiased avg@k (expected accuracy of ``k`` samples) for one item: ``c / n``.

    >>> avg_at_k(4, 1, 4)
    0.25
    """
    _check(n, c, k)
    return c / n


def _counts(outcomes: Sequence[Sequence[bool]]) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(n, c)`` per item, shape (n_items,), validating the input."""
    if len(outcomes) == 0:
        raise ValueError("no evaluation items: outcomes is empty")
    n = np.array([len(item) for item in outcomes], dtype=np.int64)
    empty = np.flatnonzero(n == 0)
    if empty.size:
        raise ValueError(f"item {int(empty[0])} has no samples")
    c = np.array([sum(bool(x) for x in item) for item in outcomes], dtype=np.int64)
    return n, c


def pass_at_k_per_item(outcomes: Sequence[Sequence[bool]], k: int) -> np.ndarray:
    """pass@k of each item, shape (n_items,). ``outcomes[i][j]``: sample j of item i is correct."""
    n, c = _counts(outcomes)
    return np.array([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n, c, strict=True)])


def summarize_outcomes(
    outcomes: Sequence[Sequence[bool]], ks: Sequence[int] = (1, 4, 8)
) -> dict[str, float | int]:
    """Macro-averaged pass@k and avg@k over items.

    ``outcomes[i][j]`` is whether sample ``j`` of item ``i`` is correct; items may have
    different sample counts. A ``k`` larger than the smallest sample count cannot be
    estimated for every item and is left out of the result (``n_samples_min`` says why);
    if no requested ``k`` fits, a ``ValueError`` is raised.

    >>> summarize_outcomes([[True, False], [False, False]], ks=(1, 2, 8))
    {'n_items': 2, 'n_samples_min': 2, 'pass@1': 0.25, 'avg@1': 0.25, 'pass@2': 0.5, 'avg@2': 0.25}
    """
    n, c = _counts(outcomes)
    n_min = int(n.min())
    usable = [k for k in ks if 1 <= k <= n_min]
    if not usable:
        raise ValueError(f"none of ks={tuple(ks)} is in [1, {n_min}] (fewest samples per item)")
    result: dict[str, float | int] = {"n_items": int(n.size), "n_samples_min": n_min}
    for k in usable:
        result[f"pass@{k}"] = float(np.mean(pass_at_k_per_item(outcomes, k)))
        result[f"avg@{k}"] = float(np.mean(c / n))
    return result

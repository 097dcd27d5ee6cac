"""Statistics for comparing training recipes across seeds: rliable and AdaStop.

- Interval estimates (IQM and mean) and probability of improvement come from rliable
  (Agarwal et al. 2021) with stratified-bootstrap percentile confidence intervals.
- The "how many seeds are enough" decision comes from AdaStop (Mathieu et al. 2023), a
  sequential permutation test with early stopping that controls the family-wise error
  over all pairwise comparisons.

Scores are arrays of shape (n_runs, n_tasks); a 1-D array is one task.

How AdaStop is mapped onto the runs we have (see :func:`adastop_decision`): AdaStop is a
group-sequential test whose design, ``n_per_stage`` seeds per group at each of at most
``n_stages`` interim analyses, must be fixed before looking at the data. We fix it by
default to AdaStop's own defaults (5 seeds per stage, 5 stages, so at most 25 seeds per
group). Given the runs on disk, ordered by seed, stage ``k`` uses the first ``k *
n_per_stage`` runs of every group still under test. We replay the interim analyses
stage by stage with a fixed permutation seed; this gives exactly the decisions the test
would have given had it been run interactively after each batch of seeds, so adding
seeds and re-running ``streamrl compare`` continues the same test. Runs past the last
complete stage are not used by AdaStop (they still count in the confidence intervals).
When a comparison is still open, the answer is how many more seeds each group needs to
complete the next stage. adastop 0.1.3's two-sided test spends twice its ``alpha``; we
pass it ``alpha / 2`` so the family-wise error is the ``alpha`` asked for.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "AdaStopResult",
    "adastop_decision",
    "as_scores",
    "bootstrap_curve",
    "improvement_interval",
    "interval_estimates",
    "probability_of_improvement",
]

Interval = tuple[float, float, float]  # (point estimate, CI low, CI high)


@functools.cache
def _rliable() -> tuple[ModuleType, ModuleType]:
    """Import ``rliable.library`` and ``rliable.metrics``.

    Compatibility shim: rliable imports ``arch.bootstrap``, and ``arch`` (7.2) calls
    ``pandas.util._decorators.deprecate_kwarg("type", "plot_type")`` at import time,
    which pandas 3 rejects (it now takes the warning class first). We wrap that private
    pandas helper only while ``arch`` is imported, then restore it.
    """
    try:
        import pandas.util._decorators as pd_decorators
    except ImportError:  # pragma: no cover - pandas is a dependency of arch
        pd_decorators = None
    original = getattr(pd_decorators, "deprecate_kwarg", None)

    def deprecate_kwarg(*args, **kwargs):  # type: ignore[no-untyped-def]
        if args and isinstance(args[0], str):  # pandas < 3 call signature
            return original(FutureWarning, *args, **kwargs)
        return original(*args, **kwargs)

    if original is not None:
        pd_decorators.deprecate_kwarg = deprecate_kwarg
    try:
        from rliable import library, metrics
    finally:
        if original is not None:
            pd_decorators.deprecate_kwarg = original
    return library, metrics


@contextlib.contextmanager
def _seeded_global_numpy(seed: int) -> Iterator[None]:
    """Seed ``np.random``'s global state and restore it afterwards.

    rliable's ``StratifiedBootstrap.update_indices`` draws with ``np.random.choice`` and
    ignores its ``random_state`` argument, so reproducibility needs the global state.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def as_scores(scores: np.ndarray | list[float], name: str = "scores") -> np.ndarray:
    """Return ``scores`` as a float array of shape (n_runs, n_tasks); 1-D means one task."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected shape (n_runs, n_tasks), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: scores must be finite")
    return arr


def _interval(point: np.ndarray, ci: np.ndarray, i: int = 0) -> Interval:
    # rliable returns point (n_stats,) and ci (2, n_stats): rows are (low, high).
    return float(np.atleast_1d(point)[i]), float(ci[0, i]), float(ci[1, i])


def interval_estimates(
    scores_by_group: Mapping[str, np.ndarray],
    reps: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, dict[str, Interval]]:
    """IQM and mean of each group with stratified-bootstrap percentile CIs (rliable).

    Args:
        scores_by_group: group -> scores, shape (n_runs, n_tasks); needs n_runs >= 2.
        reps: bootstrap replications.
        seed: seed of the bootstrap resampling.
        confidence: coverage of the intervals.

    Returns:
        ``{group: {"iqm": (point, lo, hi), "mean": (point, lo, hi)}}``.
    """
    library, metrics = _rliable()
    score_dict = {}
    for group, scores in scores_by_group.items():
        arr = as_scores(scores, name=group)
        if arr.shape[0] < 2:
            raise ValueError(f"{group}: needs at least 2 runs for a confidence interval")
        score_dict[group] = arr

    def aggregates(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    with _seeded_global_numpy(seed):
        points, cis = library.get_interval_estimates(
            score_dict, aggregates, reps=reps, confidence_interval_size=confidence
        )
    return {
        g: {"iqm": _interval(points[g], cis[g], 0), "mean": _interval(points[g], cis[g], 1)}
        for g in score_dict
    }


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y): chance that a random run of X beats a random run of Y, averaged over tasks.

    Ties count one half (Mann-Whitney U statistic, via rliable).
    """
    _, metrics = _rliable()
    return float(metrics.probability_of_improvement(as_scores(x, "x"), as_scores(y, "y")))


def improvement_interval(
    x: np.ndarray, y: np.ndarray, reps: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """P(X > Y) with a CI from rliable's independent stratified bootstrap of both groups."""
    library, metrics = _rliable()
    pair = [as_scores(x, "x"), as_scores(y, "y")]

    def poi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.array([metrics.probability_of_improvement(a, b)])

    with _seeded_global_numpy(seed):
        points, cis = library.get_interval_estimates(
            {"pair": pair}, poi, reps=reps, confidence_interval_size=confidence
        )
    return _interval(points["pair"], cis["pair"])


def bootstrap_curve(
    curves: np.ndarray,
    reps: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    aggregate: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pointwise mean of learning curves across runs with a stratified-bootstrap band.

    Args:
        curves: shape (n_runs, n_points), every run evaluated on the same x grid.
        aggregate: maps (n_runs, n_points) to (n_points,); default mean over runs.

    Returns:
        ``(center, lo, hi)``, each of shape (n_points,).
    """
    library, _ = _rliable()
    arr = np.asarray(curves, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 2:
        raise ValueError(f"need curves of shape (n_runs >= 2, n_points), got {arr.shape}")
    func = aggregate or (lambda s: np.mean(s, axis=0))
    with _seeded_global_numpy(seed):
        # Each x point is a stratum: runs are resampled independently per point.
        points, cis = library.get_interval_estimates(
            {"curve": arr}, func, reps=reps, confidence_interval_size=confidence
        )
    return np.asarray(points["curve"]), np.asarray(cis["curve"][0]), np.asarray(cis["curve"][1])


@dataclass
class AdaStopResult:
    """Outcome of AdaStop on the available runs.

    Attributes:
        decisions: (group_a, group_b) -> "equal" | "larger" | "smaller" | "continue";
            "larger" means group_a scores higher than group_b.
        stages_done: interim analyses run (0 if some group has < ``n_per_stage`` runs).
        seeds_used: group -> runs AdaStop looked at (the first ones, by seed).
        more_seeds: group -> further runs needed to complete the next stage (only groups
            still in an open comparison).
        n_per_stage, n_stages, alpha: the test's design.
    """

    decisions: dict[tuple[str, str], str]
    stages_done: int
    seeds_used: dict[str, int]
    more_seeds: dict[str, int]
    n_per_stage: int
    n_stages: int
    alpha: float
    finished: bool = field(default=False)

    @property
    def more_seeds_per_group(self) -> int:
        """Largest number of extra runs any open group needs (0 when the test is done)."""
        return max(self.more_seeds.values(), default=0)


def adastop_decision(
    scores_by_group: Mapping[str, np.ndarray],
    n_per_stage: int = 5,
    n_stages: int = 5,
    alpha: float = 0.05,
    n_permutations: int = 10_000,
    seed: int = 0,
) -> AdaStopResult:
    """Run AdaStop on every pair of groups, replaying its interim analyses on our runs.

    Args:
        scores_by_group: group -> per-run scores, ordered (we order by seed). Each run's
            score is its mean over tasks. At least 2 groups.
        n_per_stage: seeds per group added at each interim analysis (AdaStop's ``n``).
        n_stages: maximum number of interim analyses (AdaStop's ``K``).
        alpha: family-wise type I error over all pairwise comparisons.
        n_permutations: permutations approximating the null distribution (``B``).
        seed: seed of the permutation sampling.

    The design (``n_per_stage``, ``n_stages``) must not depend on the results: keep it
    fixed across re-runs so that the sequential guarantee holds. See the module docstring
    for how stages map onto runs.
    """
    if len(scores_by_group) < 2:
        raise ValueError("AdaStop compares groups: need at least 2")
    if n_per_stage < 1 or n_stages < 1:
        raise ValueError("n_per_stage and n_stages must be >= 1")
    names = list(scores_by_group)
    scores = {g: as_scores(scores_by_group[g], name=g).mean(axis=1) for g in names}
    pairs = list(itertools.combinations(range(len(names)), 2))
    comparator = _comparator(pairs, n_per_stage, n_stages, alpha, n_permutations, seed)
    stage, used = _replay_stages(comparator, scores, n_per_stage, n_stages)
    if stage == 0:
        decisions = {(names[i], names[j]): "continue" for i, j in pairs}
    else:
        # adastop keys its decisions by str() of each row of its comparisons array.
        decisions = {
            (names[int(c[0])], names[int(c[1])]): str(comparator.decisions[str(c)])
            for c in comparator.comparisons
        }
    still_open = {g for (a, b), d in decisions.items() if d == "continue" for g in (a, b)}
    target = (stage + 1) * n_per_stage
    more = {g: max(target - len(scores[g]), 0) for g in names if g in still_open}
    return AdaStopResult(
        decisions=decisions,
        stages_done=stage,
        seeds_used=used,
        more_seeds=more,
        n_per_stage=n_per_stage,
        n_stages=n_stages,
        alpha=alpha,
        finished=not still_open,
    )


def _comparator(
    pairs: list[tuple[int, int]],
    n_per_stage: int,
    n_stages: int,
    alpha: float,
    n_permutations: int,
    seed: int,
) -> Any:
    """AdaStop's comparator over ``pairs`` of group indices, at family-wise level ``alpha``."""
    from adastop import MultipleAgentsComparator

    return MultipleAgentsComparator(
        n=n_per_stage,
        K=n_stages,
        B=n_permutations,
        comparisons=np.array(pairs),  # must be an array: adastop masks it with booleans
        # adastop 0.1.3 compares |mean difference| with quantiles of the *signed* permutation
        # distribution, so its two-sided test spends 2 * alpha (a null simulation rejects
        # ~10% at alpha=0.05). That distribution is symmetric, so alpha / 2 restores level alpha.
        alpha=alpha / 2,
        seed=seed,
    )


def _replay_stages(
    comparator: Any, scores: dict[str, np.ndarray], n_per_stage: int, n_stages: int
) -> tuple[int, dict[str, int]]:
    """Feed AdaStop its interim analyses while every open group has the runs a stage
    needs; returns the stages run and the runs each group was compared on."""
    names = list(scores)
    open_groups = set(names)
    used = {g: 0 for g in names}
    stage = 0
    while stage < n_stages and not comparator.is_finished:
        needed = (stage + 1) * n_per_stage
        if any(len(scores[g]) < needed for g in open_groups):
            break
        # Groups out of every open comparison keep the runs they had; AdaStop ignores them.
        data = {g: scores[g][: needed if g in open_groups else used[g]] for g in names}
        comparator.partial_compare(data, verbose=False)
        for g in names:
            used[g] = len(data[g])
        stage += 1
        open_groups = {names[i] for c in comparator.current_comparisons for i in c}
    return stage, used

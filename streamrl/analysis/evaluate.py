"""Held-out evaluation: greedy accuracy, and pass@k / avg@k over n samples.

Evaluation runs the run's own episode (:func:`streamrl.rollout.episodes.build_episode`),
greedily or with fixed seeds, so an item is evaluated exactly as it is trained:
same prompt rendering, same per-item answer budget, same reward, and later the
same multi-turn loop. Per-item outcomes are kept (completions, correctness,
reward errors) so any analysis can be redone from the JSON without re-generating.

Items of a ``mixture`` source carry their domain, and maybe their own correctness
reward (:func:`streamrl.sources.item_correct_reward`); ``metrics`` then adds
``accuracy/<domain>`` for every domain present.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from streamrl.core.engine import InferenceEngine
from streamrl.core.sample import Sample
from streamrl.core.types import Item
from streamrl.engines.factory import make_inference_engine
from streamrl.rollout.episodes import Episode, episode_output
from streamrl.rollout.rewards import describe_error
from streamrl.sources import item_correct_reward, item_domain


@dataclass
class EvalResult:
    accuracy: float  # mean correctness of the first sample of each item
    metrics: dict[str, float]
    items: list[dict[str, Any]] = field(default_factory=list)
    reward_failures: int = 0
    episode_failures: int = 0


def is_correct(components: dict[str, float | None], correct_reward: str) -> bool:
    value = components.get(correct_reward)
    return value is not None and value >= 1.0


def domain_accuracy(items: list[Item], outcomes: list[list[bool]]) -> dict[str, float]:
    """``accuracy/<domain>``: the mean correctness of the first sample of each item of
    that domain, for every domain present (items without one add nothing).

    >>> items = [Item(id=str(k), prompt="?", metadata={"domain": d}) for k, d in enumerate("mmc")]
    >>> domain_accuracy([*items, Item(id="x", prompt="?")], [[True], [False], [True], [False]])
    {'accuracy/m': 0.5, 'accuracy/c': 1.0}
    """
    by_domain: dict[str, list[bool]] = {}
    for item, correct in zip(items, outcomes, strict=True):
        if (domain := item_domain(item)) is not None:
            by_domain.setdefault(domain, []).append(bool(correct[0]))
    return {f"accuracy/{d}": sum(c) / len(c) for d, c in by_domain.items()}


def eval_seed(seed: int, item: int, sample: int) -> int:
    """Sampling seed of an evaluation sample (distinct from training's seeds)."""
    return seed * 7919 + item * 131 + sample


def evaluate(
    engine: InferenceEngine,
    episode: Episode,
    items: list[Item],
    correct_reward: str,
    *,
    greedy: bool = True,
    samples_per_item: int = 1,
    ks: tuple[int, ...] = (1,),
    seed: int = 0,
) -> EvalResult:
    """Run ``episode`` on every item through ``engine`` and grade the trajectories.

    Greedy evaluation takes one sample per item. An episode that raises or
    rejects counts as incorrect and is recorded, never dropped. A sample is correct
    when the item's own ``metadata["correct_reward"]`` (else ``correct_reward``) is >= 1.
    """
    n = 1 if greedy else samples_per_item
    for i, item in enumerate(items):  # an evaluation item has no issue index yet
        if item.index < 0:
            item.index = i
    results = [_one_sample(r) for r in _run_episodes(engine, episode, items, n, greedy, seed)]
    outcomes: list[list[bool]] = []
    per_item: list[dict[str, Any]] = []
    reward_failures = episode_failures = 0
    for i, item in enumerate(items):
        graded = _grade_item(item, results[i * n : (i + 1) * n], correct_reward)
        outcomes.append(graded.record["correct"])
        per_item.append(graded.record)
        reward_failures += graded.reward_failures
        episode_failures += graded.episode_failures
    accuracy = sum(o[0] for o in outcomes) / max(len(outcomes), 1)
    metrics = _eval_metrics(items, outcomes, results, accuracy, n, ks)
    metrics["reward_failures"] = reward_failures
    metrics["episode_failures"] = episode_failures
    return EvalResult(accuracy, metrics, per_item, reward_failures, episode_failures)


def _one_sample(result: Any) -> Any:
    """An episode's result as one sample: a seat against fixed opponents gives one
    trajectory; an environment episode that failed becomes its error."""
    if isinstance(result, BaseException) or result is None:
        return result
    out = episode_output(result)
    return out.trajectories[0] if out.trajectories else RuntimeError(out.error)


def _run_episodes(
    engine: InferenceEngine,
    episode: Episode,
    items: list[Item],
    n: int,
    greedy: bool,
    seed: int,
) -> list[Sample | BaseException | None]:
    """``n`` episodes of every item, concurrently; a raised error is kept as the result."""

    async def run_all() -> list[Sample | BaseException | None]:
        coros = [
            episode(engine, item, eval_seed(seed, i, j), greedy=greedy)
            for i, item in enumerate(items)
            for j in range(n)
        ]
        return await asyncio.gather(*coros, return_exceptions=True)

    return asyncio.run(run_all())


@dataclass
class _GradedItem:
    record: dict[str, Any]  # the per-item JSON record
    reward_failures: int
    episode_failures: int


def _grade_item(
    item: Item, results: list[Sample | BaseException | None], correct_reward: str
) -> _GradedItem:
    """One item's samples graded: completions, correctness, lengths and errors, with a
    failed or rejected episode counted and recorded as incorrect."""
    judge = item_correct_reward(item, correct_reward)
    completions, correct, errors, lengths = [], [], [], []
    reward_failures = episode_failures = 0
    for res in results:
        if isinstance(res, BaseException) or res is None:
            episode_failures += 1
            completions.append(None)
            lengths.append(0)
            correct.append(False)
            errors.append(
                {"episode": describe_error(res) if res is not None else "episode rejected"}
            )
            continue
        meta = res.metadata
        reward_failures += bool(meta.get("reward_errors"))
        completions.append(meta.get("completion"))
        lengths.append(res.num_generated)
        correct.append(is_correct(meta.get("reward_components") or {}, judge))
        errors.append(meta.get("reward_errors") or None)
    record = {
        "id": item.id,
        "prompt": item.prompt if item.prompt is not None else item.messages,
        "answer": item.answer,
        "completions": completions,
        "generated_tokens": lengths,
        "correct": correct,
        "reward_errors": errors,
    }
    if (domain := item_domain(item)) is not None:  # (items of no domain: as before)
        record["domain"] = domain
    return _GradedItem(record, reward_failures, episode_failures)


def _eval_metrics(
    items: list[Item],
    outcomes: list[list[bool]],
    results: list[Sample | BaseException | None],
    accuracy: float,
    n: int,
    ks: tuple[int, ...],
) -> dict[str, float]:
    """Accuracy (overall and per domain), pass@k / avg@k when ``n > 1``; environment
    episodes report their return's mean and std instead of an accuracy."""
    from streamrl.analysis.passk import summarize_outcomes

    finished = [r for r in results if r is not None and not isinstance(r, BaseException)]
    returns = [sum(r.episode_returns) for r in finished if r.environment]
    metrics: dict[str, float] = {"accuracy": accuracy, "n_items": len(items), "n_samples": n}
    metrics.update(domain_accuracy(items, outcomes))
    if n > 1:
        metrics.update(summarize_outcomes(outcomes, ks=tuple(k for k in ks if k <= n)))
    if returns:  # environment episodes: their returns are the score, not an accuracy
        del metrics["accuracy"]
        metrics["return_mean"] = sum(returns) / len(returns)
        metrics["return_std"] = (
            float(torch.tensor(returns, dtype=torch.float64).std()) if len(returns) > 1 else 0.0
        )
    return metrics


def evaluate_model(
    model: torch.nn.Module,
    tokenizer: Any,
    episode: Episode,
    items: list[Item],
    correct_reward: str,
    *,
    device: str = "cpu",
    decode_slots: int = 64,
    batch_invariant: bool = True,
    **kwargs: Any,
) -> EvalResult:
    """:func:`evaluate` on a fresh engine over ``model`` (left in the mode it was in). The
    engine is batch-invariant (``rollout.batch_invariant``) unless told otherwise: a
    multi-turn episode's later turns join the batch by timing, and an evaluation gives
    the same numbers every time."""
    was_training = model.training
    engine = make_inference_engine(
        model, tokenizer, decode_slots=decode_slots, device=device, batch_invariant=batch_invariant
    )
    try:
        return evaluate(engine, episode, items, correct_reward, **kwargs)
    finally:
        engine.close()
        model.train(was_training)

"""Held-out evaluation: greedy accuracy, and pass@k / avg@k over n samples.

Per-item outcomes are kept (completions, correctness, reward errors) so any
analysis can be redone from the JSON without re-generating.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from streamrl.engines.inference import LocalEngine
from streamrl.models import encode_prompt
from streamrl.rewards import CompositeReward
from streamrl.types import GenerationRequest, Item, SamplingParams


@dataclass
class EvalResult:
    accuracy: float  # mean correctness of the first sample of each item
    metrics: dict[str, float]
    items: list[dict[str, Any]] = field(default_factory=list)
    reward_failures: int = 0


def is_correct(components: dict[str, float | None], correct_reward: str) -> bool:
    value = components.get(correct_reward)
    return value is not None and value >= 1.0


def evaluate(
    model: torch.nn.Module,
    tokenizer,
    items: list[Item],
    reward: CompositeReward,
    correct_reward: str,
    params: SamplingParams,
    *,
    n_samples: int = 1,
    ks: tuple[int, ...] = (1,),
    seed: int = 0,
    device: str = "cpu",
    max_batch_size: int = 64,
) -> EvalResult:
    """Generate ``n_samples`` completions per item and grade them.

    Greedy (``params.temperature == 0``) always uses one sample per item.
    """
    from streamrl.eval.passk import summarize_outcomes

    if params.temperature == 0:
        n_samples = 1
    was_training = model.training
    model.eval()
    engine = LocalEngine(model, tokenizer, max_batch_size=max_batch_size, device=device)
    requests = [
        GenerationRequest(
            encode_prompt(tokenizer, item), replace(params), seed * 7919 + i * 131 + j
        )
        for i, item in enumerate(items)
        for j in range(n_samples)
    ]
    results = engine.generate(requests)
    if was_training:
        model.train()

    outcomes: list[list[bool]] = []
    per_item: list[dict[str, Any]] = []
    failures = 0
    for i, item in enumerate(items):
        completions, correct, errors = [], [], []
        for res in results[i * n_samples : (i + 1) * n_samples]:
            text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
            scored = reward(text, item)
            failures += bool(scored.errors)
            completions.append(text)
            correct.append(is_correct(scored.components, correct_reward))
            errors.append(scored.errors or None)
        outcomes.append(correct)
        per_item.append(
            {
                "id": item.id,
                "prompt": item.prompt if item.prompt is not None else item.messages,
                "answer": item.answer,
                "completions": completions,
                "correct": correct,
                "reward_errors": errors,
            }
        )
    accuracy = sum(o[0] for o in outcomes) / max(len(outcomes), 1)
    metrics = {"accuracy": accuracy, "n_items": len(items), "n_samples": n_samples}
    if n_samples > 1:
        metrics.update(summarize_outcomes(outcomes, ks=tuple(k for k in ks if k <= n_samples)))
    metrics["reward_failures"] = failures
    return EvalResult(accuracy=accuracy, metrics=metrics, items=per_item, reward_failures=failures)

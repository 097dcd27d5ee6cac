"""Single-turn episode: one prompt, one completion, a verifiable reward.

An episode is an async function ``(engine, item, seed) -> Trajectory | None``.
It may call the engine as often as it needs (multi-turn and tool episodes do);
this one calls it once. Returning ``None`` rejects the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from streamrl.engines.base import InferenceEngine
from streamrl.models import encode_prompt
from streamrl.rewards import CompositeReward
from streamrl.types import GenerationRequest, GenerationResult, Item, SamplingParams, Trajectory


def trajectory_from_result(
    result: GenerationResult, reward: float, group_id: int, item_index: int, metadata: dict
) -> Trajectory:
    """Prompt tokens are masked out; generated tokens carry logprob and version."""
    n_prompt, n_gen = len(result.prompt_ids), len(result.token_ids)
    return Trajectory(
        input_ids=torch.tensor(result.prompt_ids + result.token_ids, dtype=torch.long),
        loss_mask=torch.tensor([False] * n_prompt + [True] * n_gen),
        behavior_logprobs=torch.tensor([0.0] * n_prompt + result.logprobs, dtype=torch.float32),
        versions=torch.tensor([-1] * n_prompt + result.versions, dtype=torch.long),
        reward=reward,
        group_id=group_id,
        item_index=item_index,
        metadata=metadata,
    )


@dataclass
class SingleTurnEpisode:
    """Generate one completion for ``item`` and score it with ``reward``.

    A reward component that raised or timed out is recorded in
    ``metadata["reward_errors"]``; the caller counts the episode as failed.
    """

    tokenizer: object
    sampling: SamplingParams
    reward: CompositeReward

    async def __call__(
        self, engine: InferenceEngine, item: Item, seed: int, greedy: bool = False
    ) -> Trajectory | None:
        params = replace(self.sampling, temperature=0.0) if greedy else self.sampling
        if "max_new_tokens" in item.metadata:  # a per-item answer budget
            params = replace(params, max_new_tokens=int(item.metadata["max_new_tokens"]))
        prompt_ids = encode_prompt(self.tokenizer, item)
        result = await engine.agenerate(GenerationRequest(prompt_ids, params, seed))
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        scored = await self.reward.ascore(text, item)
        metadata = {
            "completion": text,
            "finish_reason": result.finish_reason,
            "reward_components": scored.components,
            "reward_errors": scored.errors,
        }
        total = scored.total if scored.total is not None else 0.0
        return trajectory_from_result(result, total, item.index, item.index, metadata)

"""Single-turn episode: one prompt, one completion, a verifiable reward.

A hinted item (``selection.kind: hints``, prefix mode) has its hint forced at the start of
the completion: the reward scores hint + generated text; the hint's tokens are sent as
part of the prompt, so the trajectory masks them from the loss (no log-prob credit)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from streamrl.core.engine import InferenceEngine
from streamrl.core.types import (
    HINT_KEY,
    GenerationRequest,
    GenerationResult,
    Item,
    SamplingParams,
    Trajectory,
)
from streamrl.models import encode_prompt
from streamrl.rollout.episodes.base import EpisodeSpec, check_room, register_episode
from streamrl.rollout.rewards import CompositeReward


def trajectory_from_result(
    result: GenerationResult, reward: float, item_index: int, metadata: dict
) -> Trajectory:
    """Prompt tokens are masked out; generated tokens carry logprob and version."""
    n_prompt, n_gen = len(result.prompt_ids), len(result.token_ids)
    return Trajectory(
        input_ids=torch.tensor(result.prompt_ids + result.token_ids, dtype=torch.long),
        loss_mask=torch.tensor([False] * n_prompt + [True] * n_gen),
        behavior_logprobs=torch.tensor([0.0] * n_prompt + result.logprobs, dtype=torch.float32),
        versions=torch.tensor([-1] * n_prompt + result.versions, dtype=torch.long),
        reward=reward,
        item_index=item_index,
        metadata=metadata,
    )


def forced_prefix(item: Item) -> list[int]:
    """The tokens a hint forces at the start of ``item``'s completion (none without one):
    they are sent with the prompt, so they are masked from the loss and carry no log-prob."""
    return list((item.metadata.get(HINT_KEY) or {}).get("prefix_ids", ()))


def item_params(params: SamplingParams, item: Item, greedy: bool) -> SamplingParams:
    """The item's sampling: greedy on request, and its own answer budget if it has one."""
    if greedy:
        params = replace(params, temperature=0.0)
    if "max_new_tokens" in item.metadata:
        params = replace(params, max_new_tokens=int(item.metadata["max_new_tokens"]))
    return params


@dataclass
class SingleTurnEpisode:
    """Generate one completion for ``item`` and score it with ``reward``.

    A reward component that raised or timed out is recorded in
    ``metadata["reward_errors"]``; the caller counts the episode as failed.
    """

    tokenizer: Any
    sampling: SamplingParams
    reward: CompositeReward

    def prompt_ids(self, item: Item) -> list[int]:
        """The tokens the engine is asked to continue."""
        return encode_prompt(self.tokenizer, item)

    async def __call__(
        self,
        engine: InferenceEngine,
        item: Item,
        seed: int,
        *,
        greedy: bool = False,
    ) -> Trajectory | None:
        params = item_params(self.sampling, item, greedy)
        prefix = forced_prefix(item)
        prompt_ids = self.prompt_ids(item) + prefix
        request = GenerationRequest(prompt_ids, params, seed)
        result = await engine.agenerate(request)
        check_room(item, prompt_ids, result)
        text = self.tokenizer.decode(prefix + result.token_ids, skip_special_tokens=True)
        scored = await self.reward.ascore(text, item)
        metadata = scored.record({"completion": text, "finish_reason": result.finish_reason})
        if prefix:
            metadata["hint_tokens"] = len(prefix)
        total = scored.total if scored.total is not None else 0.0
        return trajectory_from_result(result, total, item.index, metadata)


@register_episode("single_turn")
def _single_turn(
    spec: EpisodeSpec, tokenizer: Any, reward: CompositeReward, sampling: SamplingParams
):
    return SingleTurnEpisode(tokenizer, sampling, reward)

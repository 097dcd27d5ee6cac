"""Shared pieces of the environment tests: a scripted policy and an environment episode
scored by the environment's return."""

from __future__ import annotations

from streamrl.core.types import GenerationResult, SamplingParams
from streamrl.rollout.envs.episode import EnvEpisode
from streamrl.rollout.rewards import CompositeReward


class ScriptedEngine:
    """Plays the policy: each call returns the next scripted move and the end token."""

    def __init__(self, tokenizer, moves: list[str], version: int = 5) -> None:
        self.tokenizer, self.moves, self.version = tokenizer, list(moves), version
        self.prompts: list[list[int]] = []

    async def agenerate(self, request) -> GenerationResult:
        self.prompts.append(list(request.prompt_ids))
        ids = self.tokenizer.encode(self.moves.pop(0), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        n = len(ids)
        return GenerationResult(request.prompt_ids, ids, [-0.5] * n, [self.version] * n, "stop")


def _episode(tok, **kw) -> EnvEpisode:
    sampling = SamplingParams(max_new_tokens=8, stop_token_ids=[tok.eos_token_id])
    return EnvEpisode(tok, sampling, CompositeReward([("env_return", 1.0)]), **kw)

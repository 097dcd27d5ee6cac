"""How a group's samples draw their tokens (``rollout.group_sampling``).

A draw rule gives each of an item's ``group_size`` samples the engine it runs on and its
sampling seed. ``independent``: the engine itself and a seed per sample. ``stratified``:
one seed for the whole group, and member j of G runs on an engine view that stamps every
request it makes with ``stratum=(j, G)`` (:class:`StratumEngine`), so the built-in engine
shifts its uniforms by j/G: each sample is still an exact draw from the policy, while
the draws of the members that share a context spread evenly over its distribution
(:attr:`streamrl.core.types.GenerationRequest.stratum`). The episode never knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from streamrl.core.engine import InferenceEngine
from streamrl.core.types import GenerationRequest, GenerationResult
from streamrl.rollout.seeds import sampling_seed

#: (engine, run seed, item index, group size) -> each sample's (engine view, seed)
Draws = Callable[[InferenceEngine, int, int, int], list[tuple[InferenceEngine, int]]]


def independent(
    engine: InferenceEngine, run_seed: int, item_index: int, group_size: int
) -> list[tuple[InferenceEngine, int]]:
    """A seed per sample, the engine as it is."""
    return [(engine, sampling_seed(run_seed, item_index, j)) for j in range(group_size)]


def stratified(
    engine: InferenceEngine, run_seed: int, item_index: int, group_size: int
) -> list[tuple[InferenceEngine, int]]:
    """One seed for the group; member j of G draws through ``StratumEngine(engine, j, G)``."""
    seed = sampling_seed(run_seed, item_index, 0)
    return [(StratumEngine(engine, (j, group_size)), seed) for j in range(group_size)]


class StratumEngine:
    """``engine`` as member j of a stratified group of G sees it: every request made
    through it carries ``stratum=(j, G)``; everything else is the engine's own."""

    def __init__(self, engine: InferenceEngine, stratum: tuple[int, int]) -> None:
        self.engine, self.stratum = engine, stratum

    @property
    def version(self) -> int:
        return self.engine.version

    def stamp(self, request: GenerationRequest) -> GenerationRequest:
        return dataclasses.replace(request, stratum=self.stratum)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self.engine.generate([self.stamp(r) for r in requests])

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        return await self.engine.agenerate(self.stamp(request))

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(state_dict, version)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def __getattr__(self, name: str) -> Any:  # what else the engine offers its episodes
        if name == "engine":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.engine, name)

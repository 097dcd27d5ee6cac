"""The inference-engine interface every engine implements (built-in, vLLM, ...)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from streamrl.core.types import GenerationRequest, GenerationResult


@runtime_checkable
class InferenceEngine(Protocol):
    """Generates tokens with per-token behaviour log-probs and weight versions.

    ``generate`` is the synchronous batch call; ``agenerate`` is the async call
    episodes use: concurrent ``agenerate`` calls are batched together by the
    engine (continuous batching). ``update_weights`` may be called from another
    thread; the engine applies it between decode steps, and every token carries
    the version that produced it.
    """

    version: int

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    async def agenerate(self, request: GenerationRequest) -> GenerationResult: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

"""The inference-engine interface every engine implements (built-in, vLLM, ...)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class BoundedContext(Protocol):
    """An engine that says how many tokens (prompt + completion) a sequence may hold;
    one that does not (a test's scripted engine) is not checked against a context."""

    max_seq_len: int


@runtime_checkable
class CountsStats(Protocol):
    """An engine that keeps counters (a dataclass: requests, failures, driven steps)
    for the workers' version reports."""

    stats: Any


def context_of(engine: object) -> int | None:
    """The engine's context in tokens, or None where it declares none."""
    return engine.max_seq_len if isinstance(engine, BoundedContext) else None

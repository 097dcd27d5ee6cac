"""The inference engine for a model: LocalEngine (or, with ``rollout.engine: vllm``,
VLLMEngine) for language models, PolicyEngine for environment policies. One place
decides, so backends, recipes and the endpoint agree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from streamrl.config import RolloutConfig
    from streamrl.engines.inference.quantize import EngineWeights


def is_policy(model: Any) -> bool:
    from streamrl.models.policies import Policy

    return isinstance(model, Policy)


def make_inference_engine(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    device: str = "cpu",
    decode_slots: int = 64,
    version: int = 0,
    weights: EngineWeights = "float32",
    compile_decode: bool = False,
    engine: str = "local",
    vllm: dict[str, Any] | None = None,
    batch_invariant: bool = False,
) -> Any:
    if is_policy(model):
        if engine != "local":
            raise ValueError(f"rollout.engine={engine} serves language models, not policies")
        from streamrl.engines.inference.policy import PolicyEngine

        return PolicyEngine(model, device=device, version=version)
    if engine == "vllm":
        from streamrl.engines.inference.vllm import VLLMEngine

        return VLLMEngine(
            model, tokenizer, decode_slots=decode_slots, version=version, **(vllm or {})
        )
    from streamrl.engines.inference.engine import LocalEngine

    return LocalEngine(
        model,
        tokenizer,
        decode_slots=decode_slots,
        device=device,
        version=version,
        weights=weights,
        compile_decode=compile_decode,
        batch_invariant=batch_invariant,
    )


def engine_options(rollout: RolloutConfig, max_staleness: int) -> dict[str, Any]:
    """The rollout engine's settings from the ``rollout`` section, for every place that
    builds one (backends, workers, endpoint, recipes), so they all build the same engine;
    ``max_staleness`` is the stream's eta (:func:`batch_invariant`)."""
    return {
        "decode_slots": rollout.decode_slots,
        "weights": rollout.engine_weights,
        "compile_decode": rollout.compile,
        "engine": rollout.engine,
        "vllm": rollout.vllm.model_dump(),
        "batch_invariant": batch_invariant(rollout, max_staleness),
    }


def batch_invariant(rollout: RolloutConfig, max_staleness: int) -> bool:
    """``rollout.batch_invariant`` resolved: 'auto' is on at ``stream.max_staleness=0``
    (where runs are bit-exact), for the built-in engine without ``rollout.compile``."""
    if rollout.batch_invariant != "auto":
        return bool(rollout.batch_invariant)
    return max_staleness == 0 and rollout.engine == "local" and not rollout.compile


def make_train_engine(model: torch.nn.Module, *, seed: int = 0, **kwargs: Any) -> Any:
    """PolicyTrainEngine for a policy (``micro_batch_sequences`` does not apply), else the
    language-model TrainEngine."""
    if is_policy(model):
        from streamrl.engines.train.policy import PolicyTrainEngine

        kwargs.pop("micro_batch_sequences", None)
        kwargs.pop("batch_invariant", None)  # a policy's forward is its own
        return PolicyTrainEngine(model, seed=seed, **kwargs)
    from streamrl.engines.train.engine import TrainEngine

    return TrainEngine(model, **kwargs)

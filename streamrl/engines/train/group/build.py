"""The sharded trainer every rank builds: its model loaded from the ``model`` section
(rank 0 passes the model it has loaded already), LoRA adapters when asked, then
:class:`~streamrl.engines.train.sharded.ShardedTrainEngine`."""

from __future__ import annotations

from typing import Any

import torch

from streamrl.config import ModelConfig


def build_sharded_trainer(
    model_cfg: ModelConfig,
    seed: int,
    engine_kwargs: dict[str, Any],
    model: torch.nn.Module | None = None,
) -> Any:
    """A sharded train engine over the current process group. Every rank starts from the
    same full model (the same seed), so each keeps its shard of the same weights."""
    from streamrl.engines.train.sharded import ShardedTrainEngine
    from streamrl.models import load_model

    if model is None:
        model, _ = load_model(
            model_cfg.name_or_path,
            gguf_file=model_cfg.gguf_file,
            dtype=model_cfg.dtype,
            seed=seed,
            options=model_cfg.options,
        )
    kwargs = {**engine_kwargs, "batch_invariant": False}  # (the sharded forward is its own)
    if model_cfg.lora_rank > 0:
        return ShardedTrainEngine.from_lora(
            model,
            r=model_cfg.lora_rank,
            alpha=model_cfg.lora_alpha,
            target_modules=model_cfg.lora_targets,
            **kwargs,
        )
    return ShardedTrainEngine(model, **kwargs)

"""Full weights out of a sharded model, one tensor at a time."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def gathered_state_dict(model: torch.nn.Module, *, keep: bool) -> dict[str, torch.Tensor]:
    """The model's full state dict as CPU tensors where ``keep`` (rank 0), else {}.

    Every rank must call it (each ``full_tensor`` is an all-gather). A tensor is gathered,
    copied to CPU and its gathered buffer freed before the next one is gathered, so the
    whole model exists at most once in a process (the CPU copy), never twice. Tied
    weights are gathered once and appear under each of their names.
    """
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, torch.Tensor | None] = {}
    for key, value in model.state_dict().items():
        tie = _storage_key(value)
        if tie in seen:
            if keep:
                out[key] = seen[tie]
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        seen[tie] = full.detach().to("cpu", copy=True) if keep else None
        if keep:
            out[key] = seen[tie]
        del full
    return out


def _storage_key(value: torch.Tensor) -> tuple:
    """The same for two names of one (tied) tensor."""
    local = value.to_local() if isinstance(value, DTensor) else value
    return (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(value.shape))


def merge_lora_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A peft model's gathered ``state`` -> the base architecture's keys, each adapted
    weight W + scale * B @ A (as ``models.lora.merged_state_dict`` does unsharded)."""
    from peft.tuners.lora import LoraLayer

    from streamrl.models.lora import _has_variant

    prefix = "base_model.model."
    out = {
        k.removeprefix(prefix).replace(".base_layer.", "."): v
        for k, v in state.items()
        if ".lora_" not in k
    }
    for name, layer in model.get_base_model().named_modules():
        if not isinstance(layer, LoraLayer) or layer.merged or layer.disable_adapters:
            continue
        if _has_variant(layer):
            raise ValueError(f"{name}: only plain LoRA (no DoRA, no bias) publishes sharded")
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                a = state[f"{prefix}{name}.lora_A.{adapter}.weight"]
                b = state[f"{prefix}{name}.lora_B.{adapter}.weight"]
                out[f"{name}.weight"] += (b @ a) * layer.scaling[adapter]
    return out

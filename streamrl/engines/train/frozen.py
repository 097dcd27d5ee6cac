"""A frozen copy of a sharded model, made without gathering it."""

from __future__ import annotations

import copy

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from streamrl.engines.train.fsdp import full as _full
from streamrl.engines.train.fsdp import local as _local
from streamrl.engines.train.fsdp import reshard, shard_like, shard_model


def sharded_frozen_copy(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    device: torch.device,
) -> torch.nn.Module:
    """The same architecture built on the meta device, sharded the same way, then each
    rank's shards (and the buffers) copied from ``model``'s: no rank holds more than its
    shard of either. LoRA adapters are merged into the copy's weights."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.device("meta"):
        twin = type(base)(copy.deepcopy(base.config))
    shard_model(twin, mesh, mp_policy)
    twin.to_empty(device=device)
    source = _base_tensors(reshard(model))
    with torch.no_grad():
        for name, tensor in [*twin.named_parameters(), *twin.named_buffers()]:
            _local(tensor).copy_(_local(source[name]))
        if hasattr(model, "peft_config"):
            _fold_adapters(model, twin)
    twin.eval().requires_grad_(False)
    return twin


def _base_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers named as the base architecture names them (a peft model's
    ``base_layer`` weights under the plain names; its adapters left out)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = {}
    for name, tensor in [*base.named_parameters(), *base.named_buffers()]:
        if ".lora_" in name or name.startswith("lora_"):
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def _fold_adapters(model: torch.nn.Module, twin: torch.nn.Module) -> None:
    """Add each LoRA layer's W + scale * B @ A delta to the twin's shard of W: the delta
    is formed full for one layer at a time and only this rank's rows are kept."""
    from peft.tuners.lora import LoraLayer

    weights = dict(twin.named_parameters())
    for name, layer in model.get_base_model().named_modules():
        if not isinstance(layer, LoraLayer) or layer.merged or layer.disable_adapters:
            continue
        target = weights[f"{name}.weight"]
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            a = _full(layer.lora_A[adapter].weight)
            b = _full(layer.lora_B[adapter].weight)
            delta = (b @ a) * layer.scaling[adapter]
            _local(target).add_(shard_like(delta.to(target.dtype), target))

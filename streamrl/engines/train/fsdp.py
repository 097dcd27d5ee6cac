"""FSDP2 wrapping of a causal LM over a device mesh, and moving between full tensors
and this rank's shards."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def default_mixed_precision(device: torch.device) -> MixedPrecisionPolicy:
    """bf16 parameters with fp32 reduction on CUDA; full fp32 elsewhere."""
    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a causal LM (LoRA-wrapped or not); [] when there are none."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "model", None), "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


# The root's method that runs a callable as one of its forwards (see ``shard_model``).
ROOT_CALL = "streamrl_root_call"


def _root_call(self: torch.nn.Module, fn: Callable[[], Any]) -> Any:
    return fn()


def root_call(model: torch.nn.Module, fn: Callable[[], Any]) -> Any:
    """``fn()`` as a forward of the sharded root ``model``: FSDP's pre-forward hook
    gathers the root's own parameters (embeddings, final norm, head) before it, the
    post-forward hook releases them (when the root reshards) and hooks the outputs for
    the backward's gathers and gradient reduce-scatter. For a forward that calls the
    decoder and the head itself instead of ``model(...)`` (the head on the loss tokens,
    packed rows)."""
    return getattr(model, ROOT_CALL)(fn)


def shard_model(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    *,
    reshard_after_forward: bool = True,
) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root; gradients are summed over the
    ranks, not averaged (the engine's loss scale already divides by the global units).
    ``reshard_after_forward=False`` keeps each layer gathered from its forward to its
    backward: one all-gather a micro-batch instead of two, for the full parameters held
    meanwhile (the root keeps its own gathered either way, FSDP's default)."""
    for layer in decoder_layers(model):
        fully_shard(
            layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    setattr(model, ROOT_CALL, types.MethodType(_root_call, model))
    register_fsdp_forward_method(model, ROOT_CALL)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def reshard(model: torch.nn.Module) -> torch.nn.Module:
    """Free the gathered parameters FSDP keeps after a forward (the root's, by default):
    afterwards every parameter is this rank's shard."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def shard_like(tensor: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This rank's shard of a full ``tensor`` placed like ``like`` (FSDP2: Shard(0))."""
    return distribute_tensor(tensor, like.device_mesh, [Shard(0)]).to_local()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself when it is not sharded)."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` (an all-gather when it is sharded)."""
    return t.full_tensor() if isinstance(t, DTensor) else t

"""A callback at every decoder layer's forward and backward (idle-core lending).

The trainer's compute is a sequence of decoder layers, forward then backward, so a
hook there sees the update in steps of one layer (~1/30 of a SmolLM2 update). Module
hooks run the callback before a layer's forward, and a gradient hook on the layer's
output runs it when the backward reaches that layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The ``model.layers`` of a Hugging Face decoder (LoRA-wrapped or not); [] if none."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "model", None), "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def install_layer_hook(model: torch.nn.Module, hook: Callable[[], None]) -> list[RemovableHandle]:
    """Calls ``hook()`` before each decoder layer's forward and, when the layer's output
    needs a gradient, before its backward. Returns the handles that remove it."""

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        hook()

    def after_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: hook())  # returns None: the gradient is unchanged

    handles = []
    for layer in decoder_layers(model):
        handles.append(layer.register_forward_pre_hook(before_forward))
        handles.append(layer.register_forward_hook(after_forward))
    return handles

"""LoRA adapters (via peft), merged weights for publishing, parameter counts."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

# Every linear layer of the decoder (peft leaves the output head out). "LoRA Without
# Regret" (Schulman et al., 2025) finds attention-only adapters fall short of full
# fine-tuning where adapters on the MLPs too match it, in RL as well.
ALL_LINEAR = "all-linear"


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of (unique: tied weights count once) parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: float = 16,
    dropout: float = 0.0,
    target_modules: str | list[str] = ALL_LINEAR,
) -> nn.Module:
    """Wrap ``model`` with LoRA adapters; only the adapter weights stay trainable.

    ``target_modules`` is peft's: module name suffixes (``["q_proj", "v_proj"]``) or
    ``"all-linear"`` (every linear layer but the output head).
    """
    from peft import LoraConfig, get_peft_model

    if not isinstance(target_modules, str) and list(target_modules) == [ALL_LINEAR]:
        # peft takes this one as a string
        target_modules = ALL_LINEAR
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft still calls transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
        )
        return get_peft_model(model, config)


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the weights as a plain (non-LoRA) model would hold them.

    For a peft model the active adapters are folded in (W + B @ A * scale) without
    touching the training model, and keys match the base model class's own
    ``state_dict()`` (no ``base_model.model.`` prefix, no ``base_layer``, no
    ``lora_*``). Any other model just gets a detached copy of its ``state_dict()``.
    This is what the trainer publishes to inference engines.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {k: _cpu_copy(v) for k, v in model.state_dict().items()}
    base = model.get_base_model()
    lora_layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    if any(_has_variant(m) for m in lora_layers.values()):
        # DoRA / LoRA bias / other variants: let peft merge, on a copy.
        merged = copy.deepcopy(model).merge_and_unload()
        return {k: _cpu_copy(v) for k, v in merged.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        out[key.replace(".base_layer.", ".")] = _cpu_copy(value)
    for name, layer in lora_layers.items():
        if layer.merged or layer.disable_adapters:
            continue  # base weight already is the effective weight
        key = f"{name}.weight"
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                delta = layer.get_delta_weight(adapter)
                out[key] += delta.to("cpu", out[key].dtype)
    return out


def _has_variant(layer: nn.Module) -> bool:
    """True if the LoRA layer uses something beyond plain W + BA (DoRA, bias, ...)."""
    variants = getattr(layer, "lora_variant", None) or {}
    use_dora = getattr(layer, "use_dora", None) or {}
    lora_bias = getattr(layer, "lora_bias", None) or {}
    return bool(variants) or any(use_dora.values()) or any(lora_bias.values())


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)

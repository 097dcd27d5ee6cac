"""LoRA adapters over a shared frozen base: which modules a Tinker ``LoraConfig`` adapts,
how a model gets them, and an adapter's tensors (what a publish or a checkpoint moves).

Adapters are peft's (:func:`streamrl.models.apply_lora`) on a :func:`share` copy of the
base, so every adapter's parameters are its own while the base weights are one set.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import torch
from torch import nn

from streamrl.models import apply_lora
from streamrl.stream.endpoint.tinker.bases import share

_ATTENTION = {"self_attn", "attn", "attention", "self_attention"}
_MLP = {"mlp", "feed_forward", "ffn"}


@dataclass(frozen=True)
class LoraSpec:
    """What a ``create_lora_training_client`` call asked for (and ``alpha``, the service's)."""

    rank: int
    alpha: float
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora_config.rank: expected >= 1, got {self.rank}")
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise ValueError("lora_config: at least one of train_attn, train_mlp, train_unembed")

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def shape(self) -> tuple:
        """What decides the adapter's tensors (not the seed): adapters of one shape load
        into each other's modules."""
        return (self.rank, self.alpha, self.train_attn, self.train_mlp, self.train_unembed)


def target_modules(model: nn.Module, spec: LoraSpec) -> list[str]:
    """Full names of the linear layers ``spec`` adapts: attention projections, MLP
    projections, the output head (``lm_head``)."""
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        parts = set(name.split("."))
        if name.split(".")[-1] == "lm_head":
            wanted = spec.train_unembed
        elif parts & _ATTENTION:
            wanted = spec.train_attn
        elif parts & _MLP:
            wanted = spec.train_mlp
        else:
            wanted = False
        if wanted:
            out.append(name)
    if not out:
        raise ValueError(f"lora_config: {type(model).__name__} has no layer of the kinds asked")
    return out


def with_adapter(base: nn.Module, spec: LoraSpec) -> nn.Module:
    """A model over ``base``'s (shared, frozen) weights with a fresh adapter of ``spec``:
    B = 0, so it computes exactly what ``base`` does until trained. Returns the inner
    model (the base's own class, its linear layers wrapped by peft)."""
    model = share(base)
    targets = target_modules(model, spec)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # the output head may share its weight with the embedding: the adapter is only
        # ever added at the head, never merged into the shared weight
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        if spec.seed is not None:
            torch.manual_seed(spec.seed)
        peft_model = apply_lora(model, r=spec.rank, alpha=spec.alpha, target_modules=targets)
    return peft_model.get_base_model()


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapter's parameters by name (peft's ``lora_A`` / ``lora_B``)."""
    return {n: p for n, p in model.named_parameters() if ".lora_" in n}


@torch.no_grad()
def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the adapter's tensors: a snapshot the model's later training
    does not change."""
    return {n: p.detach().to("cpu", copy=True) for n, p in adapter_parameters(model).items()}


def check_adapter(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """ValueError unless ``state`` has exactly ``model``'s adapter tensors (names, shapes)."""
    params = adapter_parameters(model)
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ValueError(
            f"adapter does not fit this model: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    for name, p in params.items():
        if p.shape != state[name].shape:
            raise ValueError(
                f"adapter tensor {name}: shape {list(state[name].shape)}, expected {list(p.shape)}"
            )


@torch.no_grad()
def load_adapter(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies ``state`` into ``model``'s adapter; the names and shapes must match exactly."""
    check_adapter(model, state)
    for name, p in adapter_parameters(model).items():
        p.copy_(state[name])

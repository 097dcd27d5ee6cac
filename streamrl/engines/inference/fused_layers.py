"""The decoder layers of a Llama-family model, fused for the engine's decode step.

Beyond reading its weights, a decode step on CPU pays for every op it dispatches: the
Hugging Face layer runs ~60 ATen ops (an RMSNorm alone is eight of them, RoPE
fourteen). :class:`FusedDecoder` computes the same layer with fewer, larger ops:

- one matrix product for Q, K and V, and one for the MLP's gate and up projections,
  on weights concatenated once per weight version (:meth:`FusedDecoder.refresh`);
- ``F.rms_norm`` for every RMSNorm;
- RoPE on the queries and keys together, as ``x * cos + roll(x) * sin'`` with the
  sign of ``rotate_half`` folded into ``sin'`` once per step.

The model's own modules keep their weights and stay what the state dict, weight
updates and every other forward use. The fused weights are copies, rebuilt after each
update of the layers they come from; in fp32 that is ~50% more memory for the layer
weights (280 MB on SmolLM2-135M). With packed ``rollout.engine_weights`` the fused
projections are packed like every other linear layer (:mod:`streamrl.engines.inference.quantize`),
and the separate projections they replace are left unpacked.

The engine fuses by default on the CPU, where it was measured
(``benchmarks/results/engine.md``), and elsewhere only when asked
(``LocalEngine(fuse_layers=True)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from streamrl.engines.inference.quantize import PackedLinear, loaded_by, pack_many


def _concat(linears: list[nn.Module], into: nn.Linear | None = None) -> nn.Linear:
    """One fp32 linear layer whose output is the concatenation of ``linears``' outputs
    (the weights of ``into`` are replaced when given: the same module and parameters)."""
    w = torch.cat([m.weight.detach() for m in linears])
    biases = [m.bias for m in linears]
    if into is not None:
        into.weight.data = w
        if into.bias is not None:
            into.bias.data = torch.cat([b.detach() for b in biases])  # type: ignore[union-attr]
        return into
    # built on the meta device: a real nn.Linear would first fill a random init (slow)
    fused = nn.Linear(w.shape[1], w.shape[0], bias=biases[0] is not None, device="meta")
    fused.weight = nn.Parameter(w, requires_grad=False)
    if fused.bias is not None:
        b = torch.cat([b.detach() for b in biases])  # type: ignore[union-attr]
        fused.bias = nn.Parameter(b, requires_grad=False)
    return fused


def fused_away(model: nn.Module) -> list[nn.Module]:
    """The projections :class:`FusedDecoder` replaces by its fused copies (so the engine
    does not pack them: it never runs them)."""
    cfg = model.config
    out: list[nn.Module] = []
    for layer in model.model.layers[: cfg.num_hidden_layers]:
        a, m = layer.self_attn, layer.mlp
        out += [a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj]
    return out


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """An HF Llama-style RMSNorm (fp32 statistics, weight applied in the input dtype)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], norm.weight, eps)
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def supports_fused(model: nn.Module) -> bool:
    """True when every decoder layer has the plain Llama layout :class:`FusedDecoder` computes."""
    cfg = model.config
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    for layer in model.model.layers[: cfg.num_hidden_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        projs = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        mlp_projs = [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(type(m) in (nn.Linear, PackedLinear) for m in projs + mlp_projs):
            return False  # e.g. LoRA-wrapped or quantised modules: leave them to their forward
        if len({m.bias is None for m in projs[:3]}) != 1 or not hasattr(mlp, "act_fn"):
            return False
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if type(norm).__name__.endswith("LayerNorm"):  # only RMSNorm is fused
                return False
    return True


class FusedDecoder:
    """Runs ``layers`` on a flat ``(T, E)`` token axis with fused projections.

    ``attend(layer_idx, q, k, v, scaling)`` is the slot cache's attention, taking
    ``(1, H, T, D)`` queries and ``(1, H_kv, T, D)`` keys/values.
    """

    def __init__(self, model: nn.Module, packed: str = "") -> None:
        cfg = model.config
        self.packed = packed
        self.layers = list(model.model.layers[: cfg.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.qk_norm = hasattr(attn, "q_norm")  # Qwen3: RMSNorm per head before RoPE
        # RoPE rounded as transformers' apply_rotary_pos_emb (a product, a product, a sum)
        # rather than with a fused multiply-add: the batch-invariant engine's, so that its
        # numbers are the trainer's, whose forward runs the model's own modules
        self.rope_as_model = False
        self.model = model
        self.qkv: list[nn.Linear] = [None] * len(self.layers)  # type: ignore[list-item]
        self.gate_up: list[nn.Linear] = [None] * len(self.layers)  # type: ignore[list-item]
        self.refresh()

    def refresh(self, names: Iterable[str] | None = None, executor: Executor | None = None) -> int:
        """Rebuilds the fused weights from the layers' own after a weight update: those
        holding a parameter among ``names`` (all when None). Returns how many it rebuilt.
        Packed ones are packed together, on ``executor``'s threads when given."""
        touched = loaded_by(self.model, names)
        jobs = []
        for i, layer in enumerate(self.layers):
            a, m = layer.self_attn, layer.mlp
            for fused, parts in (
                (self.qkv, [a.q_proj, a.k_proj, a.v_proj]),
                (self.gate_up, [m.gate_proj, m.up_proj]),
            ):
                if any(touched(part) for part in parts):
                    jobs.append((fused, i, parts))
        # the concatenations are memory-bound: on threads they were no faster. A layer
        # built before gets its new weights in the same module, which a compiled decode
        # step (rollout.compile) keeps calling
        built = [_concat(parts, into=fused[i]) for fused, i, parts in jobs]
        if self.packed:
            pack_many(built, self.packed, executor)
            for layer in built:
                # the engine reads only the packed copy, and refresh() rebuilds it from the
                # layers' own weights: the fp32 concatenation need not stay
                layer.weight.data = layer.weight.data.new_empty(0)
        for (fused, i, _), layer in zip(jobs, built, strict=True):
            fused[i] = layer
        return len(jobs)

    def linear_layers(self) -> list[nn.Module]:
        """Every linear layer a step runs through this decoder, in order."""
        return [
            lin
            for i, layer in enumerate(self.layers)
            for lin in (self.qkv[i], layer.self_attn.o_proj, self.gate_up[i], layer.mlp.down_proj)
        ]

    def rope_tables(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(1, T, D) cos/sin -> (T, 1, D) cos and the signed sin of ``x*cos + roll(x)*sin'``."""
        half = self.head_dim // 2
        signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[0, :, None], signed[0, :, None]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # rotate_half(x) = cat(-x2, x1) = roll(x, D/2) with the first half's sign flipped
        rolled = torch.roll(x, self.head_dim // 2, dims=-1)
        if self.rope_as_model:  # two products and a sum, rounded as the model's modules do
            return x * cos + rolled * sin
        return torch.addcmul(x * cos, rolled, sin)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Any
    ) -> torch.Tensor:
        """h: (T, E) -> (T, E) after every layer; cos, sin from :meth:`rope_tables`."""
        t = h.shape[0]
        nh, nkv, d = self.heads, self.kv_heads, self.head_dim
        for i, layer in enumerate(self.layers):
            a, m = layer.self_attn, layer.mlp
            x = _rms_norm(h, layer.input_layernorm)
            qkv = self.qkv[i](x).view(t, nh + 2 * nkv, d)
            v = qkv[:, nh + nkv :]
            if self.qk_norm:
                q = self._rope(_rms_norm(qkv[:, :nh], a.q_norm), cos, sin)
                k = self._rope(_rms_norm(qkv[:, nh : nh + nkv], a.k_norm), cos, sin)
            else:
                qk = self._rope(qkv[:, : nh + nkv], cos, sin)
                q, k = qk[:, :nh], qk[:, nh:]
            o = attend(
                i,
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                self.scaling,
            )
            h = h + a.o_proj(o.reshape(t, nh * d))
            gate, up = self.gate_up[i](_rms_norm(h, layer.post_attention_layernorm)).chunk(2, -1)
            h = h + m.down_proj(m.act_fn(gate) * up)
        return h

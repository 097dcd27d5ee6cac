"""The engine's fused decoder layers (streamrl.engines.inference.fused_layers) against the model's
own layer modules and Hugging Face ``generate``, on every Llama-family layout they
cover: plain Llama, Mistral, Qwen2 (Q/K/V biases) and Qwen3 (per-head Q/K norms)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.fused_layers import supports_fused
from tests.unit.engines.test_inference_engine import PROMPTS, V, full_logprobs, hf_greedy

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def model_of(arch: str, seed: int = 0) -> nn.Module:
    config_cls, model_cls = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = config_cls(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    model = model_cls(cfg).eval()
    with torch.no_grad():  # non-zero biases and norm weights, so a dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("arch", list(ARCHS))
def test_fused_engine_matches_hf_generate_and_the_unfused_engine(arch):
    model = model_of(arch)
    if arch == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    fused = LocalEngine(model, decode_slots=2)
    assert fused.runner.fused is not None
    lengths = [5, 12, 3, 9, 7, 15]
    greedy = [
        GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=n))
        for p, n in zip(PROMPTS, lengths, strict=True)
    ]
    for p, n, r in zip(PROMPTS, lengths, fused.generate(greedy), strict=True):
        assert r.token_ids == hf_greedy(model, p, n)

    # sampled, with refills and shared prefixes (each prompt twice, as in a group)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    reqs = [GenerationRequest(p, sp, seed=i) for i, p in enumerate(PROMPTS + PROMPTS)]
    unfused = LocalEngine(model_of(arch), decode_slots=3, fuse_layers=False)
    assert unfused.runner.fused is None
    a = LocalEngine(model_of(arch), decode_slots=3).generate(reqs)
    b = unfused.generate(reqs)
    for p, x, y in zip(PROMPTS + PROMPTS, a, b, strict=True):
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(
            torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0
        )
        ref = full_logprobs(model, p, x.token_ids, sp)
        torch.testing.assert_close(torch.tensor(x.logprobs), ref, atol=1e-4, rtol=0)


def test_a_full_weight_update_reaches_the_fused_projections():
    """The fused Q/K/V and gate/up weights are copies: an update of every weight must
    rebuild them, or the engine would keep decoding with the old projections."""
    engine = LocalEngine(model_of("llama", seed=0), decode_slots=3)
    new = model_of("llama", seed=1)
    engine.update_weights({k: v.detach().clone() for k, v in new.state_dict().items()}, 1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    for p, r in zip(
        PROMPTS,
        engine.generate([GenerationRequest(p, sp, seed=i) for i, p in enumerate(PROMPTS)]),
        strict=True,
    ):
        assert r.versions == [1] * len(r.token_ids)
        ref = full_logprobs(new, p, r.token_ids, sp)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)


def test_layers_of_another_shape_run_their_own_modules():
    model = model_of("llama")
    q = model.model.layers[1].self_attn.q_proj
    model.model.layers[1].self_attn.q_proj = nn.Sequential(q)  # e.g. an adapter wrapper
    assert not supports_fused(model)
    engine = LocalEngine(model, decode_slots=2)
    assert engine.runner.fused is None
    greedy = GenerationRequest(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=6))
    assert engine.generate([greedy])[0].token_ids == hf_greedy(model, PROMPTS[1], 6)

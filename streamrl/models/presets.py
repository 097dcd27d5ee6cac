"""Tiny Llama configurations trained from scratch with the char tokenizer."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

# Shape of each preset; the vocabulary comes from the tokenizer. Parameter counts
# (tests/unit/models/test_models.py checks them) are for the default 101-token char vocabulary.
TINY_PRESETS: dict[str, dict[str, Any]] = {
    # ~0.19M parameters: unit tests.
    "tiny-small": dict(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
    ),
    # ~0.60M parameters: the default laptop model (learns arithmetic tasks on CPU).
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
    ),
    # ~4.8M parameters: bigger CPU experiments and benchmarks.
    "tiny-large": dict(
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=768,
    ),
}

PRESET_CONTEXT = 256  # tokens (prompt + completion) every preset holds

_COMMON: dict[str, Any] = dict(
    max_position_embeddings=PRESET_CONTEXT,
    tie_word_embeddings=True,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
)


def build_preset(
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
) -> LlamaForCausalLM:
    """Randomly initialise preset ``name`` for ``tokenizer``'s vocabulary.

    The init is a function of ``seed`` only: the global torch RNG is left untouched.
    """
    if name not in TINY_PRESETS:
        raise KeyError(f"unknown preset {name!r}; known presets: {sorted(TINY_PRESETS)}")
    config = LlamaConfig(
        **_COMMON,
        **TINY_PRESETS[name],
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    return model.to(dtype)

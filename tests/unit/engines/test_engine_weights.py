"""rollout.engine_weights=float16 and onednn: the engine decodes on packed weights (fp16
for FBGEMM, fp32 in oneDNN's layout), its log-probs are exact for what it sampled,
weight updates re-pack, and a run reports the small train/inference gap it opens."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.config import load_config
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.fused_layers import fused_away
from streamrl.engines.inference.quantize import (
    ROWS_PER_BLOCK,
    PackedLinear,
    pack_linears,
    pack_threads,
    repack,
)
from streamrl.run.launch import train
from streamrl.run.preflight import PreflightError, check_engine_weights
from tests.tiny_run import metric_rows, tiny_rl_config
from tests.unit.engines.test_inference_engine import PROMPTS, full_logprobs, tiny_llama

SP = SamplingParams(temperature=0.8, top_k=20, max_new_tokens=10)


PACKINGS = ["float16", "onednn"]


def packed_copy(model: torch.nn.Module, weights: str = "float16") -> torch.nn.Module:
    out = copy.deepcopy(model)
    pack_linears(out, weights)  # type: ignore[arg-type]
    return out


def sample(engine: LocalEngine) -> list:
    return engine.generate([GenerationRequest(p, SP, seed=i) for i, p in enumerate(PROMPTS)])


@pytest.mark.parametrize("weights", PACKINGS)
def test_packed_engine_logprobs_are_exact_for_its_own_weights_and_near_fp32(weights):
    fp32 = tiny_llama()
    engine = LocalEngine(copy.deepcopy(fp32), decode_slots=3, weights=weights)
    # every linear layer a step runs is packed (the fused projections included); the
    # separate projections the fused ones replace are never run, so they stay unpacked
    ran = engine.runner.linear_layers()
    assert ran and all(type(m) is PackedLinear for m in ran)
    skipped = set(map(id, fused_away(engine.model)))
    for m in engine.model.modules():
        if isinstance(m, torch.nn.Linear):
            assert (type(m) is PackedLinear) != (id(m) in skipped)
    # the state dict is the fp32 model's: same keys, same values
    ref_state = fp32.state_dict()
    assert engine.model.state_dict().keys() == ref_state.keys()
    assert all(torch.equal(v, ref_state[k]) for k, v in engine.model.state_dict().items())

    gap, reference = [], packed_copy(fp32, weights)
    for p, r in zip(PROMPTS, sample(engine), strict=True):
        own = full_logprobs(reference, p, r.token_ids, SP)  # a forward on packed weights
        torch.testing.assert_close(torch.tensor(r.logprobs), own, atol=1e-4, rtol=0)
        gap.append((own - full_logprobs(fp32, p, r.token_ids, SP)).abs().max())
    # fp16 weights move the log-probs, by a little; oneDNN's fp32 products by rounding
    assert (1e-7 < max(gap) < 1e-2) if weights == "float16" else (max(gap) < 1e-5)


@pytest.mark.parametrize("weights", PACKINGS)
def test_weight_updates_repack_including_a_tied_head(weights):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    engine = LocalEngine(LlamaForCausalLM(cfg).eval(), decode_slots=4, weights=weights)
    new = LlamaForCausalLM(cfg).eval()  # other random weights
    # named_parameters() lists a tied head once, as the embedding: an update may lack it
    update = {k: v.detach().clone() for k, v in new.named_parameters()}
    assert "lm_head.weight" not in update
    engine.update_weights(update, version=3)
    expected = packed_copy(new, weights)
    for p, r in zip(PROMPTS, sample(engine), strict=True):
        assert r.versions == [3] * len(r.token_ids)
        ref = full_logprobs(expected, p, r.token_ids, SP)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)
    # a partial update re-packs only the layers it touches; the tied head follows
    # the embedding
    assert repack(engine.model, ["model.embed_tokens.weight"]) == 1
    assert repack(engine.model, ["model.layers.0.mlp.down_proj.weight"]) == 1
    assert repack(engine.model, ["model.norm.weight"]) == 0
    assert repack(engine.model) == 2 * 2 + 1  # o_proj and down_proj of each layer, the head
    # the fused projections are rebuilt the same way: layer 0's gate/up from its up_proj
    assert engine.runner.fused.refresh(["model.layers.0.mlp.up_proj.weight"]) == 1
    assert engine.runner.fused.refresh(["model.norm.weight"]) == 0
    assert engine.runner.fused.refresh() == 2 * 2


def test_a_packed_layer_trains_on_its_fp32_weight():
    layer = torch.nn.Linear(8, 4)
    pack_linears(torch.nn.Sequential(layer), "float16")
    x = torch.randn(3, 8)
    y = layer(x)  # grad enabled and a trainable weight: exact fp32
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    y.sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        packed = layer(x)
    assert not torch.equal(packed, y.detach())
    torch.testing.assert_close(packed, y.detach(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("weights", PACKINGS)
def test_a_large_layer_is_packed_in_blocks_of_rows(weights):
    layer = torch.nn.Linear(16, ROWS_PER_BLOCK + 100)  # two blocks, with a bias
    pack_linears(torch.nn.Sequential(layer), weights)
    assert len(layer._packed) == 2
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        out, ref = layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)
        half = torch.nn.functional.linear(x, layer.weight.half().float(), layer.bias)
    assert out.shape == ref.shape == (2, 3, ROWS_PER_BLOCK + 100)
    if weights == "float16":
        torch.testing.assert_close(out, half, atol=1e-5, rtol=1e-5)  # exactly fp16 weights
        assert not torch.equal(out, ref)
    else:  # fp32 weights: the same products, summed in another order
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_packing_on_threads_builds_the_same_layers(monkeypatch):
    """Blocks of every layer are packed on a pool's threads at load and at each weight
    update; the layers must come out as a serial packing builds them, blocks in order."""
    monkeypatch.setattr(
        "streamrl.engines.inference.quantize.ROWS_PER_BLOCK", 16
    )  # many blocks a layer
    torch.manual_seed(0)
    base, new = tiny_llama(), tiny_llama()
    update = {
        k: v.detach().clone() + 0.01 * torch.randn_like(v) for k, v in new.state_dict().items()
    }
    outputs = []
    for threads in (1, 3):  # the engine's pool packs at construction and at every update
        monkeypatch.setattr("streamrl.engines.inference.engine.pack_threads", lambda n=threads: n)
        engine = LocalEngine(copy.deepcopy(base), decode_slots=3, weights="float16")
        assert (engine._packer is None) == (threads == 1)
        first = sample(engine)
        engine.update_weights(update, version=1)
        outputs.append((first, sample(engine)))
        assert max(len(m._packed) for m in engine.runner.linear_layers()) > 2
    (serial0, serial1), (threaded0, threaded1) = outputs
    for a, b in [*zip(serial0, threaded0, strict=True), *zip(serial1, threaded1, strict=True)]:
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs  # bit for bit
    reference = packed_copy(copy.deepcopy(base))
    reference.load_state_dict(update)
    repack(reference)
    for p, r in zip(PROMPTS, serial1, strict=True):  # and they are the updated weights
        ref = full_logprobs(reference, p, r.token_ids, SP)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("weights", PACKINGS)
def test_an_engine_over_a_model_packed_before_follows_its_own_weights(weights):
    """The local backend's extra rollout workers get a deep copy of a model the first
    worker's engine already packed. Their engines must pack it as their own ``weights``
    say and re-pack at every update, so that no stale packed copy is ever sampled."""
    torch.manual_seed(0)
    base, new = tiny_llama(), tiny_llama()
    with torch.no_grad():  # sharper than a random init, so that stale weights show
        for w in new.parameters():
            if w.dim() == 2:
                w.mul_(4.0)
    update = {k: v.detach().clone() for k, v in new.state_dict().items()}
    first = LocalEngine(copy.deepcopy(base), decode_slots=3, weights=weights)
    # a copy of a packed model runs: it packs its own copy from its fp32 weights
    copied = copy.deepcopy(first.runner.lm_head)
    assert "_packed" not in copied.__dict__ and type(copied) is PackedLinear
    x = torch.randn(2, copied.in_features)
    with torch.no_grad():
        assert torch.equal(copied(x), first.runner.lm_head(x))
    second = LocalEngine(copy.deepcopy(first.model), decode_slots=3, weights=weights)
    assert second.packed == weights
    assert all(type(m) is PackedLinear for m in second.runner.linear_layers())
    second.update_weights(update, version=1)
    reference = packed_copy(new, weights)
    for p, r in zip(PROMPTS, sample(second), strict=True):
        ref = full_logprobs(reference, p, r.token_ids, SP)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)
    # an fp32 engine over a packed model runs the fp32 weights
    plain = LocalEngine(copy.deepcopy(first.model), decode_slots=3)
    assert not plain.packed
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    for p, r in zip(PROMPTS, sample(plain), strict=True):
        ref = full_logprobs(base, p, r.token_ids, SP)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-5, rtol=0)


def test_packing_threads_follow_the_cores_and_a_thread_budget(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pack_threads() == 4  # at most 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # e.g. a Ray actor with num_cpus=1
    assert pack_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert pack_threads() == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {3}, raising=False)  # pinned
    assert pack_threads() == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name_or_path=mlp", "rollout.episode=gym"], "not environment policies"),
        (["runtime.device=cuda"], "FBGEMM"),
        (["model.dtype=bfloat16"], "model.dtype=bfloat16"),
    ],
)
def test_preflight_refuses_what_cannot_be_packed(overrides, message):
    cfg = load_config(None, ["rollout.engine_weights=float16", *overrides])
    with pytest.raises(PreflightError, match=message):
        check_engine_weights(cfg)
    with pytest.raises(ValueError, match="float32, float16 or onednn"):
        pack_linears(torch.nn.Linear(2, 2), "int8")  # type: ignore[arg-type]


def _mismatch(tmp_path: Path, weights: str, backend: str) -> list[dict[str, float]]:
    cfg = tiny_rl_config(
        tmp_path / weights,
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "algorithm.dynamic_sampling=false",
        "train.items_per_step=2",
        "train.steps=3",
        "stream.max_staleness=0",
        "runtime.threads=1",
        f"runtime.backend={backend}",
        f"rollout.engine_weights={weights}",
    )
    rows = metric_rows(train(cfg).run_dir)
    return [
        {k: v for k, v in r.items() if k.startswith("mismatch")} for r in rows if "mismatch/kl" in r
    ]


@pytest.mark.slow  # three runs, one on the process backend
def test_runs_on_packed_engine_weights_report_a_small_mismatch(tmp_path: Path):
    """At eta = 0 every token comes from the trainer's own weights, so mismatch/* is the
    numerics alone: ~1e-7 per token for the fp32 engine and for oneDNN's fp32 products,
    larger but small for fp16. The fp16 run uses the process backend, whose engine starts
    on random weights: a missing re-pack after the first update would show as a huge KL."""
    exact = _mismatch(tmp_path, "float32", "local")
    packed = _mismatch(tmp_path, "float16", "process")
    onednn = _mismatch(tmp_path, "onednn", "local")
    assert len(exact) == len(packed) == len(onednn) == 3
    gap32 = max(r["mismatch/abs_log_ratio_mean"] for r in exact)
    gap16 = [r["mismatch/abs_log_ratio_mean"] for r in packed]
    assert gap32 < 1e-6 and 10 * gap32 < min(gap16) and max(gap16) < 1e-3
    # oneDNN's fp32 products differ from the trainer's by rounding only
    assert max(r["mismatch/abs_log_ratio_mean"] for r in onednn) < 1e-6
    # the k3 KL ~ gap^2 / 2: small, but not cancelled to 0 in float arithmetic
    assert all(0 < r["mismatch/kl"] < 1e-6 for r in packed)


def test_copy_named_ignores_unknown_names_and_refuses_a_wrong_shape_before_copying() -> None:
    """The engine's publish path (load_state_dict(strict=False) through a name map)."""
    from streamrl.engines.inference.engine import copy_named

    model = torch.nn.Linear(3, 2)
    tensors = dict(model.state_dict(keep_vars=True))
    before = model.weight.detach().clone()
    with pytest.raises(RuntimeError, match="bias: \\[3\\], expected \\[2\\]"):
        copy_named(model, tensors, {"weight": torch.ones(2, 3), "bias": torch.zeros(3)})
    assert torch.equal(model.weight, before)  # nothing copied
    copy_named(model, tensors, {"weight": torch.ones(2, 3), "not_a_weight": torch.zeros(1)})
    assert torch.equal(model.weight, torch.ones(2, 3))

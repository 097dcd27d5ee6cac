"""rollout.compile: the engine's decode-only steps run through a compiled graph. It
decodes what the eager engine decodes, with log-probs exact for its weights; it follows
weight updates without recompiling (its guards are only the tensors'); packed fp16
layers go through it as an opaque op; and it refuses models it cannot compile."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from streamrl.config import load_config
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.factory import engine_options, make_inference_engine
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.quantize import PackedLinear, pack_linears
from streamrl.run.launch import train
from streamrl.run.preflight import PreflightError, check_engine_compile
from tests.tiny_run import metric_rows
from tests.unit.engines.test_engine_weights import packed_copy
from tests.unit.engines.test_inference_engine import (
    PROMPTS,
    CharTokenizer,
    full_logprobs,
    tiny_llama,
)

SP = SamplingParams(temperature=1.0, max_new_tokens=12)


def generate(engine: LocalEngine, seed: int) -> list:
    # six prompts on three slots: refills mix prefill steps (eager) with decode-only ones
    return engine.generate([GenerationRequest(p, SP, seed=seed + i) for i, p in enumerate(PROMPTS)])


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float16", "onednn"])
def test_compiled_steps_decode_like_eager_ones_and_follow_weight_updates(weights: str) -> None:
    """Packed weights (fp16, or fp32 in oneDNN's layout): packed layers through the custom
    op, re-packed in the same modules (plain fp32 weights: the run below). Then every
    kind of row, on the same graphs."""
    model = tiny_llama()
    tok = CharTokenizer()  # for the forced row's stop string (below)
    eager = LocalEngine(copy.deepcopy(model), tok, decode_slots=3, weights=weights)
    compiled = LocalEngine(
        copy.deepcopy(model), tok, decode_slots=3, weights=weights, compile_decode=True
    )
    graph, calls = compiled.runner.compiled, []
    compiled.runner.compiled = lambda *a: calls.append(1) or graph(*a)
    counters.clear()

    new = tiny_llama(seed=1)  # other random weights, published as version 1
    for version, weights_of in ((0, model), (1, new)):
        if version:
            state = {k: v.detach().clone() for k, v in new.state_dict().items()}
            eager.update_weights(state, version=1)
            compiled.update_weights(state, version=1)
        before = len(calls)
        want, got = generate(eager, 10 * version), generate(compiled, 10 * version)
        assert len(calls) - before >= 20  # most steps only decode, and ran compiled
        ref = packed_copy(weights_of, weights)
        for p, w, g in zip(PROMPTS, want, got, strict=True):
            assert g.token_ids == w.token_ids and g.versions == [version] * len(g.token_ids)
            torch.testing.assert_close(
                torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0
            )
            # exact for the weights it holds: the new ones after the update
            own = full_logprobs(ref, p, g.token_ids, SP)
            torch.testing.assert_close(torch.tensor(g.logprobs), own, atol=1e-4, rtol=0)
        if not version:
            graphs = counters["stats"]["unique_graphs"]
            assert graphs >= 1
    # and nothing was compiled again: one graph serves every weight version
    assert counters["stats"]["unique_graphs"] == graphs
    draws_match_for_every_kind_of_row(eager, compiled, calls)


def draws_match_for_every_kind_of_row(eager: LocalEngine, compiled: LocalEngine, calls) -> None:
    """The graph draws raw and greedy rows itself; a step with a tempered or top-k row
        samples again from the graph's logits, and a forced row decoding one token a step takes
    its given token. Either
        way the tokens and log-probs are the eager engine's (a graph whose draw ignored the
        greedy flag fails here)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    kinds = {
        "raw and greedy rows (drawn in the graph)": [SP, greedy],
        "tempered and top-k rows too (drawn again)": [
            SP,
            greedy,
            SamplingParams(temperature=0.7, max_new_tokens=12),
            SamplingParams(temperature=1.0, top_k=5, max_new_tokens=12),
        ],
    }
    for kind, params in kinds.items():
        reqs = [
            GenerationRequest(p, params[i % len(params)], seed=i) for i, p in enumerate(PROMPTS)
        ]
        # a stop string (never met) keeps the forced tokens out of the prefill: they are
        # taken one decode step at a time, through the graph
        forced_sp = SamplingParams(max_new_tokens=12, stop=["zz"])
        reqs[1] = GenerationRequest(PROMPTS[1], forced_sp, forced_ids=[5, 6, 7, 8, 9, 10, 11, 12])
        before = len(calls)
        want, got = eager.generate(reqs), compiled.generate(reqs)
        assert len(calls) - before >= 20, kind
        for w, g in zip(want, got, strict=True):
            assert g.token_ids == w.token_ids, kind
            torch.testing.assert_close(
                torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0
            )
        assert got[1].token_ids == [5, 6, 7, 8, 9, 10, 11, 12]


@pytest.mark.slow
def test_a_run_with_compiled_decode_steps_follows_every_weight_update(tiny_config) -> None:
    """At eta = 0 every token comes from the trainer's own weights, so mismatch/* is the
    numerics alone: an engine graph that kept using old weights would show a large gap.
    fp32 engine weights: the fused projections are rewritten in the same modules."""
    cfg = tiny_config(
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "rollout.decode_slots=8",
        "rollout.compile=true",
        "algorithm.dynamic_sampling=false",
        "train.items_per_step=2",
        "train.steps=3",
        "stream.max_staleness=0",
        "runtime.backend=local",
        "runtime.threads=1",
    )
    counters.clear()
    rows = metric_rows(train(cfg).run_dir)
    assert counters["stats"]["unique_graphs"] >= 1  # the engine's decode steps compiled
    gaps = [r["mismatch/abs_log_ratio_mean"] for r in rows if "mismatch/kl" in r]
    assert len(gaps) == 3 and max(gaps) < 1e-5


def test_compile_needs_the_fused_layers_on_the_cpu() -> None:
    with pytest.raises(ValueError, match="compile_decode needs the engine's fused"):
        LocalEngine(tiny_llama(), decode_slots=2, fuse_layers=False, compile_decode=True)
    with pytest.raises(ValueError, match="for the CPU engine, not meta"):
        LocalEngine(tiny_llama(), decode_slots=2, device="meta", compile_decode=True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name_or_path=mlp", "rollout.episode=gym"], "not environment policies"),
        (["runtime.device=cuda"], "set rollout.compile=false"),
    ],
)
def test_preflight_refuses_what_cannot_be_compiled(overrides: list[str], message: str) -> None:
    check_engine_compile(load_config(None, ["rollout.compile=false", *overrides]))  # off: fine
    with pytest.raises(PreflightError, match=message):
        check_engine_compile(load_config(None, ["rollout.compile=true", *overrides]))


def test_rollout_compile_reaches_every_engine_built_from_the_config() -> None:
    assert engine_options(load_config(None, []).rollout, 0)["compile_decode"] is False
    cfg = load_config(None, ["rollout.compile=true", "rollout.decode_slots=4"])
    opts = engine_options(cfg.rollout, cfg.stream.max_staleness)
    assert opts["compile_decode"] is True and opts["decode_slots"] == 4
    assert opts["engine"] == "local"
    engine = make_inference_engine(tiny_llama(), None, **opts)
    assert isinstance(engine, LocalEngine)
    assert engine.runner.compiled is not None and engine.decode_slots == 4


def test_packed_linear_op_runs_the_layer_its_key_names_even_in_a_deep_copy() -> None:
    model = tiny_llama()
    pack_linears(model, "float16")
    twin = copy.deepcopy(model)  # copies the keys too: packing it again must re-key it
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2.0)
    pack_linears(twin, "float16")
    x = torch.randn(5, 64)
    pairs = list(zip(packed_layers(model), packed_layers(twin), strict=True))
    assert pairs
    for a, b in pairs:
        assert a._key != b._key
        for layer in (a, b):
            with torch.no_grad():  # the packed path (with a gradient it runs fp32)
                via_op = torch.ops.streamrl.packed_linear(x, layer._key, layer.out_features)
                torch.testing.assert_close(via_op, layer(x), atol=0, rtol=0)
                fp32 = F.linear(x, layer.weight, layer.bias)
            torch.testing.assert_close(via_op, fp32, atol=1e-2, rtol=1e-2)


def packed_layers(model: torch.nn.Module) -> list[PackedLinear]:
    return [m for m in model.modules() if isinstance(m, PackedLinear) and m.in_features == 64]

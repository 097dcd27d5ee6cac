"""VLLMEngine, the InferenceEngine protocol on vLLM, against a stand-in for vLLM's API
(tests/fake_vllm.py; CI installs no vLLM, and test_vllm_real.py runs where it is): what it asks vLLM for, how it reads the
answers (tokens, behaviour log-probs, per-token versions, finish reasons), teacher
forcing, weight updates between steps, failures, and a whole run through it. The
built-in LocalEngine is the reference wherever both decode the same way."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import sys
import threading
from pathlib import Path

import pytest
import torch

from streamrl.config import load_config
from streamrl.core.engine import InferenceEngine
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.factory import engine_options, make_inference_engine
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.vllm import VLLMEngine, engine_args, sampling_params, scoring_params
from streamrl.models.presets import build_preset
from streamrl.models.tokenizer import build_char_tokenizer
from streamrl.run.launch import train
from streamrl.run.preflight import PreflightError, check_selection, check_vllm_engine
from tests import fake_vllm
from tests.tiny_run import metric_rows, tiny_rl_config
from tests.unit.engines.test_inference_engine import full_logprobs

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17], [6] * 9, [9, 10]]
# raw, tempered, top-k, top-p, greedy and mixed rows
ROWS = [
    SamplingParams(temperature=1.0, max_new_tokens=8),
    SamplingParams(temperature=0.7, top_k=5, max_new_tokens=8),
    SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=8),
    SamplingParams(temperature=0.0, max_new_tokens=8),
    SamplingParams(temperature=0.5, top_k=3, top_p=0.9, max_new_tokens=8),
    SamplingParams(temperature=1.0, max_new_tokens=8),
]


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_preset("tiny", tok, seed=3).eval(), tok


@pytest.fixture
def vllm(monkeypatch):
    return fake_vllm.install(monkeypatch)


def engine(tiny, **kw) -> VLLMEngine:
    model, tok = tiny
    return VLLMEngine(copy.deepcopy(model), tok, **kw)


def requests(params: list[SamplingParams], forced=None) -> list[GenerationRequest]:
    forced = forced or [None] * len(params)
    return [
        GenerationRequest(p, sp, seed=100 + i, forced_ids=f)
        for i, (p, sp, f) in enumerate(zip(PROMPTS[: len(params)], params, forced, strict=True))
    ]


def test_behaviour_logprobs_are_the_sampling_distributions(tiny, vllm):
    eng = engine(tiny, decode_slots=4, version=3)
    assert isinstance(eng, InferenceEngine)
    params = ROWS
    results = eng.generate(requests(params))
    for req, res in zip(requests(params), results, strict=True):
        assert len(res.token_ids) == 8 and res.finish_reason == "length"
        ref = full_logprobs(tiny[0], req.prompt_ids, res.token_ids, req.params)
        torch.testing.assert_close(torch.tensor(res.logprobs), ref, atol=1e-5, rtol=0)
        assert res.versions == [3] * 8
    # what vLLM was asked: the sampled token's processed log-prob, no EOS stop, the seed
    (llm,) = vllm.LLMEngine.instances
    assert llm.args.max_num_seqs == 4 and llm.args.max_model_len == 256
    assert llm.steps < 6 * 8  # batched: 4 sequences a step
    p = sampling_params(vllm, requests(params)[1], 8)
    assert (p.logprobs, p.ignore_eos, p.seed, p.top_k, p.temperature) == (0, True, 101, 5, 0.7)


def like_the_built_in_engine(tiny, reqs, **kw) -> list:
    """VLLMEngine's results, after checking them against LocalEngine's: the same tokens
    and finish reasons, and log-probs within float rounding."""
    ours = engine(tiny, **kw).generate(reqs)
    ref = LocalEngine(copy.deepcopy(tiny[0]), tiny[1], **kw).generate(reqs)
    for a, b in zip(ours, ref, strict=True):
        assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0
        )
    return ours


def stop_cases(tok) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[7, 9, 11, 13]),
        SamplingParams(temperature=0, max_new_tokens=12, stop=[tok.decode([8]), "zz"]),
        SamplingParams(temperature=0, max_new_tokens=3),
        SamplingParams(temperature=0, max_new_tokens=300),  # ends at max_seq_len
        SamplingParams(temperature=0, max_new_tokens=0),
        SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[2]),
    ]


def test_stop_rules_and_greedy_tokens_match_the_built_in_engine(tiny, vllm):
    tok = tiny[1]
    reqs = requests(stop_cases(tok))
    reqs.append(GenerationRequest([4] * 40, SamplingParams(temperature=0), seed=1))  # no room
    ours = like_the_built_in_engine(tiny, reqs, max_seq_len=40)
    assert ours[3].finish_reason == "length" and len(PROMPTS[3]) + len(ours[3].token_ids) == 40
    assert ours[4].token_ids == [] and ours[6].token_ids == []


def test_forced_tokens_are_scored_and_end_where_decoding_would(tiny, vllm):
    tok = tiny[1]
    forced = [[3, 4, 7, 5, 6], [9, 8, 9, 9], [1] * 10, [4] * 50, [5, 6], []]
    params = [
        SamplingParams(max_new_tokens=12, stop_token_ids=[7]),  # stops at the stop token
        SamplingParams(max_new_tokens=12, stop=[tok.decode([8, 9])]),  # at a stop string
        SamplingParams(max_new_tokens=4),  # at max_new_tokens
        SamplingParams(max_new_tokens=100),  # at max_seq_len
        SamplingParams(temperature=0.0, max_new_tokens=5),  # greedy rows: raw log-softmax
        SamplingParams(max_new_tokens=5),  # nothing to score
    ]
    reqs = requests(params, forced)
    at_the_limit = reqs.pop(3)
    ours = like_the_built_in_engine(tiny, reqs, max_seq_len=40)
    assert [len(r.token_ids) for r in ours] == [3, 3, 4, 2, 0]
    # vLLM takes no prompt as long as max_model_len: one forced token fewer than LocalEngine
    (limit,) = engine(tiny, max_seq_len=40).generate([at_the_limit])
    (ref,) = LocalEngine(copy.deepcopy(tiny[0]), tok, max_seq_len=40).generate([at_the_limit])
    assert len(limit.token_ids) == 40 - len(at_the_limit.prompt_ids) - 1 == len(ref.token_ids) - 1
    assert limit.finish_reason == "length"
    torch.testing.assert_close(
        torch.tensor(limit.logprobs), torch.tensor(ref.logprobs[:-1]), atol=1e-4, rtol=0
    )
    with pytest.raises(ValueError, match="raw: a forced request needs temperature 1"):
        engine(tiny).generate([GenerationRequest([5], SamplingParams(temperature=0.7), 0, [3])])


def test_weights_load_between_steps_and_label_the_tokens_after_them(tiny, vllm):
    eng = engine(tiny, decode_slots=8)
    new_model = build_preset("tiny", tiny[1], seed=4).eval()
    done: list = []
    reqs = requests([SamplingParams(temperature=1.0, max_new_tokens=10)] * 3)
    eng._enqueue([(r, done.append) for r in reqs])
    for _ in range(4):
        eng._step()
    eng.update_weights(new_model.state_dict(), 7)  # idle between steps: loaded now
    assert eng.version == 7 and eng.stats.prefix_cache_resets == 0  # requests still run
    while eng._has_work():
        eng._step()
    (llm,) = vllm.LLMEngine.instances
    assert llm.cache_resets == 1 and eng.stats.prefix_cache_resets == 1
    for req, res in zip(reqs, done, strict=True):
        assert res.versions == [0] * 4 + [7] * 6
        # the stand-in recomputes every position, so each token after the update is
        # the new model's draw; its log-prob is the new model's
        ref = full_logprobs(new_model, req.prompt_ids, res.token_ids, req.params)
        torch.testing.assert_close(torch.tensor(res.logprobs[4:]), ref[4:], atol=1e-5, rtol=0)
    for name, value in new_model.state_dict().items():
        torch.testing.assert_close(llm.model.state_dict()[name], value)


def test_a_failed_request_fails_alone_and_a_failed_step_fails_those_in_flight(tiny, vllm):
    eng = engine(tiny)
    (llm,) = vllm.LLMEngine.instances
    results: list = [None] * 3
    reqs = requests([SamplingParams(max_new_tokens=4)] * 3)
    eng._enqueue([(r, lambda res, i=i: results.__setitem__(i, res)) for i, r in enumerate(reqs)])
    eng._step()  # admitted as "0", "1", "2"
    llm.abort_next = {"1"}
    while eng._has_work():
        eng._step()
    assert isinstance(results[1], RuntimeError) and "'abort'" in str(results[1])
    assert [len(results[i].token_ids) for i in (0, 2)] == [4, 4]
    assert eng.stats.requests_failed == 1
    # a request vLLM refuses (here: a stand-in refusing every forced one) fails alone
    refuse = llm.add_request

    def add_request(rid, prompt, params):
        if params.prompt_logprobs is not None:
            raise ValueError("refused")
        return refuse(rid, prompt, params)

    llm.add_request = add_request
    mixed = [reqs[0], GenerationRequest([5, 6], SamplingParams(), 0, [3, 4]), reqs[2]]
    out: list = [None] * 3
    eng._enqueue([(r, lambda res, i=i: out.__setitem__(i, res)) for i, r in enumerate(mixed)])
    while eng._has_work():
        eng._step()
    assert isinstance(out[1], ValueError) and [len(out[i].token_ids) for i in (0, 2)] == [4, 4]
    assert eng.stats.requests_failed == 2
    llm.add_request = refuse
    llm.fail_next_step = RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        eng.generate(reqs[:2])
    assert not llm.running and eng.num_active == 0  # aborted in vLLM too
    assert len(eng.generate(reqs[:1])[0].token_ids) == 4  # and the engine still serves


def test_agenerate_batches_concurrent_calls_and_pause_holds_them(tiny, vllm):
    eng = engine(tiny, decode_slots=8)
    reqs = requests([SamplingParams(max_new_tokens=6)] * 6)
    expected = eng.generate(reqs)
    steps = vllm.LLMEngine.instances[0].steps

    async def run():
        return await asyncio.gather(*(eng.agenerate(r) for r in reqs))

    eng.pause()
    out: list = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(run())))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not out  # paused: no step runs
    eng.resume()
    t.join()
    eng.close()
    assert [r.token_ids for r in out[0]] == [r.token_ids for r in expected]  # per-request seeds
    assert vllm.LLMEngine.instances[0].steps - steps == 6  # one step per token, all batched


def test_rollout_engine_vllm_is_built_by_the_factory_and_checked_before_the_run(
    tiny, vllm, monkeypatch
):
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.vllm.enforce_eager=true"])
    eng = make_inference_engine(
        copy.deepcopy(tiny[0]), tiny[1], **engine_options(cfg.rollout, cfg.stream.max_staleness)
    )
    assert isinstance(eng, VLLMEngine)
    args = vllm.LLMEngine.instances[0].args
    assert (args.dtype, args.enforce_eager, args.gpu_memory_utilization) == ("bfloat16", True, 0.5)
    check_vllm_engine(cfg)
    for bad, message in (
        ("rollout.compile=true", "rollout.compile=True applies to the built-in engine"),
        ("rollout.engine_weights=float16", "engine_weights=float16 applies to the built-in"),
        ("model.name_or_path=mlp", "serves language models, not environment policies"),
    ):
        with pytest.raises(PreflightError, match=message):
            check_vllm_engine(load_config(None, ["rollout.engine=vllm", *bad.split()]))
    # the likelihood gate's own check: vLLM's prompt log-probs are raw
    bad = ["rollout.engine=vllm", "selection.kind=likelihood", "rollout.temperature=0.7"]
    with pytest.raises(PreflightError, match="it needs rollout.temperature=1"):
        check_selection(load_config(None, bad))
    check_selection(load_config(None, bad[:2]))
    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed
    with pytest.raises(PreflightError, match=r"pip install 'streamrl\[vllm\]'"):
        check_vllm_engine(cfg)
    with pytest.raises(ImportError, match=r"streamrl\[vllm\]"):
        make_inference_engine(
            copy.deepcopy(tiny[0]), tiny[1], **engine_options(cfg.rollout, cfg.stream.max_staleness)
        )


def train_through_vllm(tmp_path: Path, *overrides: str) -> None:
    """4 GRPO steps with rollout.engine=vllm. vLLM decodes with the trainer's fp32
    numerics here (the stand-in, or the real one in float32), so the engine-vs-trainer
    mismatch is rounding: a token mislabelled by one version would show in it."""
    cfg = tiny_rl_config(
        tmp_path,
        "rollout.engine=vllm",
        *overrides,
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "algorithm.dynamic_sampling=false",
        "train.items_per_step=4",
        "train.steps=4",
        "stream.max_staleness=1",
        "runtime.backend=local",
    )
    rows = [r for r in metric_rows(train(cfg).run_dir) if "time/update" in r]
    assert len(rows) == 4
    assert max(r["mismatch/abs_log_ratio_mean"] for r in rows) < 1e-4


def test_a_run_trains_through_the_vllm_engine(tmp_path: Path, vllm):
    train_through_vllm(tmp_path)
    assert int(vllm.LLMEngine.instances[0].version) >= 3  # the trainer's weights arrived


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (a CUDA extra)"
)
def test_the_requests_are_valid_for_the_real_vllm(tiny, tmp_path):
    """Where vLLM imports (it needs no GPU for this), the arguments streamrl passes are
    fields of its real EngineArgs and SamplingParams, which refuse unknown names."""
    import vllm

    args = engine_args(
        vllm, str(tmp_path), max_seq_len=64, decode_slots=4, seed=0, dtype="bfloat16"
    )
    assert args.logprobs_mode == "processed_logprobs" and args.async_scheduling is False
    req = GenerationRequest([5], SamplingParams(top_k=3, stop=["x"], stop_token_ids=[2]), 9)
    p = sampling_params(vllm, req, 8)
    assert (p.max_tokens, p.logprobs, p.seed, p.stop, p.ignore_eos) == (8, 0, 9, ["x"], True)
    assert scoring_params(vllm, req).prompt_logprobs == 0

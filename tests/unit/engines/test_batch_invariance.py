"""Batch invariance (LocalEngine(batch_invariant=True), rollout.batch_invariant): a
request's tokens and log-probs are the same, bit for bit, alone and batched with random
others that arrive at random steps, with every sampling option, forced tokens, shared
prompts, slot refills, any thread count and a CPU hog beside it."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
import subprocess
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from streamrl.config import load_config
from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import Batch, GenerationRequest, GenerationResult, Item, SamplingParams
from streamrl.engines import invariant
from streamrl.engines.factory import batch_invariant
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.train import engine as train_module
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.packing import pack
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.worker import rollout_group
from streamrl.run.assembly import episode_spec
from streamrl.run.preflight import PreflightError, check_batch_invariant
from tests.tiny_run import algorithm_of


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny", seed=0)[0]


def smollm2_shaped() -> LlamaForCausalLM:
    """Two random layers of SmolLM2-135M's shape (width 576, 9 query and 3 kv heads of 64,
    MLP 1536, a 49,152-token vocabulary)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()


def random_requests(rng: random.Random, vocab: int, n: int) -> list[GenerationRequest]:
    """Groups sharing a prompt, every sampling option, stop tokens and forced tokens."""
    out: list[GenerationRequest] = []
    while len(out) < n:
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        for _ in range(rng.choice([1, 1, 3])):  # a group shares its prompt's KV
            temperature = rng.choice([0.0, 1.0, 1.0, 0.7, 1.6])
            params = SamplingParams(
                temperature=temperature,
                top_k=rng.choice([0, 0, 5]),
                top_p=rng.choice([1.0, 1.0, 0.8]),
                max_new_tokens=rng.randint(1, 24),
                stop_token_ids=rng.sample(range(vocab), 3) if rng.random() < 0.3 else [],
            )
            forced = None
            if rng.random() < 0.15:  # scoring a known continuation
                forced = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
            out.append(GenerationRequest(prompt, params, rng.randrange(1 << 40), forced))
    return out[:n]


def run_arriving(engine: LocalEngine, arrivals: list[tuple[int, GenerationRequest]]):
    """Each request joins the engine's queue before step ``at``; returns the results."""
    results: list[GenerationResult | None] = [None] * len(arrivals)
    step = 0
    while any(r is None for r in results):
        for i, (at, req) in enumerate(arrivals):
            if at == step:
                engine._enqueue([(req, lambda res, i=i: results.__setitem__(i, res))])
        engine._step()
        step += 1
    assert all(isinstance(r, GenerationResult) for r in results), results
    return results


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert torch.equal(torch.tensor(a.logprobs), torch.tensor(b.logprobs))  # bit for bit


def check_invariance(model, seed: int, n: int, **engine_kw) -> LocalEngine:
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    reqs = random_requests(rng, vocab, n)
    alone = LocalEngine(model, decode_slots=2, batch_invariant=True, **engine_kw)
    solo = [alone.generate([r])[0] for r in reqs]  # one at a time (over stale slots)
    engine = LocalEngine(
        model, decode_slots=rng.randint(3, 8), batch_invariant=True, **engine_kw
    )  # fewer slots than requests: refills
    arrivals = [(rng.randint(0, 12), r) for r in reqs]
    batched = run_arriving(engine, arrivals)
    for a, b in zip(solo, batched, strict=True):
        assert_same(a, b)
    assert engine.stats.slot_refills > 0
    assert engine.stats.prefix_tokens_reused > 0 or not engine.fast_path
    return engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alone_and_batched_at_random_arrivals_are_bit_identical(tiny, seed):
    check_invariance(tiny, seed, n=14)


@pytest.mark.parametrize(
    "kw",
    [{"fuse_layers": False}, {"weights": "onednn"}, {"weights": "float16"}],
    ids=["model-layers", "onednn", "float16"],
)
def test_every_engine_variant_is_batch_invariant(tiny, kw):
    check_invariance(tiny, 3, n=10, **kw)


def test_smollm2_shaped_layers_are_batch_invariant():
    check_invariance(smollm2_shaped(), 4, n=6)


def test_the_per_slot_fallback_is_batch_invariant():
    """A model outside the Llama family: every slot runs its own forward."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    engine = check_invariance(GPT2LMHeadModel(cfg).eval(), 7, n=8)
    assert not engine.fast_path


@pytest.mark.parametrize("threads, hog", [(2, False), (1, True)], ids=["2-threads", "cpu-hog"])
def test_thread_count_and_a_cpu_hog_change_nothing(tiny, threads, hog):
    """At two torch threads, or with a busy loop beside the engine on the cores: alone and
    batched still agree (the numbers depend on the thread count, never on timing)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        check_invariance(tiny, 5, n=8)
    finally:
        torch.set_num_threads(before)
        if busy is not None:
            busy.kill()
            busy.wait()


def test_without_it_batching_changes_the_logprobs(tiny):
    """The check above can fail: the default numerics differ alone and batched."""
    rng = random.Random(6)
    reqs = random_requests(rng, tiny.config.vocab_size, 10)
    solo = [LocalEngine(tiny, decode_slots=2).generate([r])[0] for r in reqs]
    batched = LocalEngine(tiny, decode_slots=6).generate(reqs)
    assert any(a.logprobs != b.logprobs for a, b in zip(solo, batched, strict=True))


def test_padding_rows_keep_every_row_as_it_is_alone():
    """The padding discipline itself: a row of a linear layer and of attention is the
    same in calls of any row count (1 to 40) and any number of masked keys."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 101)
    x = torch.randn(40, 64, generator=g)
    ref = layer(invariant.pad_rows(x))[:40]
    for m in range(1, 41):
        assert torch.equal(layer(invariant.pad_rows(x[:m]))[:m], ref[:m])
    q, keys = torch.randn(6, 3, 32, generator=g), torch.randn(6, 64, 32, generator=g)
    vals = torch.randn(6, 64, 32, generator=g)
    neg = torch.finfo(torch.float32).min
    mask = torch.where(torch.arange(64) < 9, 0.0, neg)[None, None]
    ref = invariant.attention(q, keys, vals, mask, 0.2)
    for length in (16, 32, 48):
        short = keys[:2, :length], vals[:2, :length], mask[..., :length]
        assert torch.equal(invariant.attention(q[:2], *short, 0.2), ref[:2])
    with pytest.raises(ValueError, match="multiple of 16"):
        invariant.attention(q, keys[:, :20], vals[:, :20], mask[..., :20], 0.2)


def test_a_failing_request_fails_its_group_alone_as_a_counted_failure():
    """Two groups share one batch-invariant engine; one group's requests cannot be served
    (a NaN temperature): it is reported failed (episode_error), and the other group comes
    out as it does alone."""
    cfg = load_config(None, ["model.name_or_path=tiny-small"])
    model, tok = load_model_and_tokenizer("tiny-small", seed=0)
    algorithm = algorithm_of(cfg)
    algorithm.finish_group = lambda samples, extras: samples  # keep equal-reward groups
    good = build_episode(episode_spec(cfg), tok, build_reward(cfg.reward))
    bad = dataclasses.replace(good, sampling=SamplingParams(temperature=float("nan")))
    a, b = (
        Item(id="a", prompt="1+2=", answer="3", index=0),
        Item(id="b", prompt="3+4=", answer="7", index=1),
    )

    def run(*groups):
        engine = LocalEngine(model, tok, decode_slots=8, batch_invariant=True)

        async def main():
            return await asyncio.gather(
                *(rollout_group(engine, ep, algorithm, item, 4, 0) for ep, item in groups)
            )

        return asyncio.run(main())

    done, failed = run((good, a), (bad, b))
    (alone,) = run((good, a))
    assert isinstance(failed, GroupRejected) and failed.outcome == "failed"
    assert failed.reason == "episode_error:ValueError" and "temperature" in failed.detail
    assert isinstance(done, GroupDone) and isinstance(alone, GroupDone)
    for x, y in zip(done.trajectories, alone.trajectories, strict=True):
        assert torch.equal(x.input_ids, y.input_ids)
        assert torch.equal(x.behavior_logprobs, y.behavior_logprobs)


def test_the_trainer_computes_the_engines_logprobs_packed_and_padded(monkeypatch):
    """SmolLM2-shaped layers (a vocabulary large enough for the trainer to pack rows and
    run the head on the loss tokens only): a batch-invariant trainer's log-prob of every
    generated token is the batch-invariant engine's, bit for bit, with rows packed side
    by side (groups sharing a prompt) or padded, in evaluation and in training mode."""
    model = smollm2_shaped()
    rng = random.Random(8)
    reqs = []
    for i in range(8):
        if i % 4 == 0:  # a group of four shares each prompt
            prompt = [rng.randrange(49152) for _ in range(rng.randint(20, 40))]
        reqs.append(GenerationRequest(prompt, SamplingParams(max_new_tokens=rng.randint(2, 9)), i))
    results = LocalEngine(copy.deepcopy(model), decode_slots=8, batch_invariant=True).generate(reqs)
    n, t = (
        len(reqs),
        max(len(q.prompt_ids) + len(r.token_ids) for q, r in zip(reqs, results, strict=True)),
    )
    ids = torch.zeros(n, t, dtype=torch.long)
    real, loss = torch.zeros(n, t, dtype=torch.bool), torch.zeros(n, t, dtype=torch.bool)
    behaviour = torch.zeros(n, t)
    for i, (q, r) in enumerate(zip(reqs, results, strict=True)):
        p, end = len(q.prompt_ids), len(q.prompt_ids) + len(r.token_ids)
        ids[i, :end] = torch.tensor(q.prompt_ids + r.token_ids)
        real[i, :end], loss[i, p:end] = True, True
        behaviour[i, p:end] = torch.tensor(r.logprobs)
    batch = Batch(
        ids,
        real,
        loss,
        behaviour,
        torch.zeros(n, t, dtype=torch.long),
        torch.zeros(n),
        torch.zeros(n, dtype=torch.long),
    )
    layouts = []

    def packing(*args, **kwargs):  # the layouts the packed trainer used
        layouts.append(pack(*args, **kwargs))
        return layouts[-1]

    monkeypatch.setattr(train_module, "pack", packing)
    for packed in (True, False):
        trainer = TrainEngine(copy.deepcopy(model), batch_invariant=True, packed=packed)
        assert torch.equal(trainer.compute_logprobs(batch)[loss], behaviour[loss])
        trainer.model.train()
        with torch.enable_grad():
            out = trainer._forward(trainer.model, batch, with_entropy=True)
        assert torch.equal(out["logprobs"].detach()[loss], behaviour[loss])
    assert layouts and all(x is not None and x.segments is not None for x in layouts)


def test_the_setting_is_on_at_eta0_and_refused_where_it_cannot_hold():
    """rollout.batch_invariant: 'auto' is on at stream.max_staleness=0 only (and not with
    rollout.compile); true with a compiled engine or vLLM is refused before a run."""
    on = {
        (): False,
        ("stream.max_staleness=0",): True,
        ("stream.max_staleness=0", "rollout.compile=true"): False,
        ("stream.max_staleness=0", "rollout.batch_invariant=false"): False,
        ("rollout.batch_invariant=true",): True,
    }
    for overrides, expected in on.items():
        cfg = load_config(None, list(overrides))
        assert batch_invariant(cfg.rollout, cfg.stream.max_staleness) is expected, overrides
    for other in ("rollout.compile=true", "rollout.engine=vllm"):
        with pytest.raises(PreflightError, match="rollout.batch_invariant=true"):
            check_batch_invariant(load_config(None, ["rollout.batch_invariant=true", other]))

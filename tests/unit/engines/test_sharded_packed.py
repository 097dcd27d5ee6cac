"""The sharded trainer's lean forward (the vocabulary head on the loss tokens only, a
group's prompt packed once), run inside the root's FSDP hooks: on 2 gloo ranks it gives
the unsharded engine's log-probs and update, LoRA too, and a rank without rows or a
micro-batch without loss tokens still joins every collective."""

from __future__ import annotations

import pytest
import torch

import streamrl.engines.train.engine as train
from streamrl.algorithms import PolicyLossParams, make_rl_loss_fn
from streamrl.core.types import Batch
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.sharded import RankZero, ShardedTrainEngine, follow
from tests.sharded_harness import run_ranks
from tests.unit.engines.test_packing import grouped_batch
from tests.unit.engines.test_train_engine import tiny_model

pytestmark = pytest.mark.slow  # spawned ranks

# a vocabulary at the head-on-targets threshold, tied to the input embedding (SmolLM2's
# layout: the tied weight is the root's, gathered by the root's hook)
MODEL = dict(vocab_size=train.HEAD_ON_TARGETS_MIN_VOCAB, tie_word_embeddings=True)

# (aggregation, micro_batch_sequences, num_minibatches, engine options) on 9 rows (2
# prompts x 4, then a row without loss tokens), 5 / 4 a rank: the first packs 3-row
# micro-batches and leaves rank 1 a micro-batch of the loss-free row alone (a
# zero-weighted pass); the second takes 3 steps of 3 rows, rank 1 with 1 row and then an
# empty pass; the third 9 steps of one row each: rank 1 never has a row; the fourth
# accumulates unsharded gradients over rank 0's 3 micro-batches and rank 1's 2 and an
# empty pass, reduced once; the fifth keeps each layer gathered from forward to backward
CASES = [
    ("token_mean", 3, 1, {}),
    ("seq_mean_token_mean", 2, 3, {}),
    ("token_mean", 1, 9, {}),
    ("seq_mean_token_sum_norm", 2, 1, {"accumulate_unsharded": True}),
    ("token_mean", 2, 2, {"reshard_after_forward": False}),
    # kept gathered through a minibatch: one all-gather, one reduce-scatter
    ("seq_mean_token_mean", 1, 2, {"reshard_after_forward": False, "accumulate_unsharded": True}),
]


def _batch() -> Batch:
    """``grouped_batch`` and a copy of its first row without loss tokens."""
    batch = grouped_batch()
    fields = {k: v for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    out = {k: torch.cat([v, v[:1]]) for k, v in fields.items()}
    out["loss_mask"][-1] = False
    out["advantages"][-1] = 0.0
    return Batch(**out)


def _loss(agg: str):
    return make_rl_loss_fn("ppo_clip", PolicyLossParams(agg_mode=agg, max_tokens=10))


def _counting_pack(layouts: list[int]):
    """``engine.pack`` that counts the packed layouts it returns."""
    pack = train.pack

    def counted(*args, **kwargs):
        layout = pack(*args, **kwargs)
        layouts.append(layout is not None)
        return layout

    return counted


def _run(rank: int, engine: ShardedTrainEngine, agg: str, minibatches: int):
    if rank:
        follow(engine)
        return None
    trainer = RankZero(engine)
    logprobs = trainer.compute_logprobs(_batch())
    metrics = trainer.train_batch(_batch(), _loss(agg), num_minibatches=minibatches)
    weights = trainer.state_dict_for_inference()
    trainer.stop()
    return logprobs, metrics, weights


def _ranks(rank: int) -> dict:
    layouts: list[int] = []
    train.pack = _counting_pack(layouts)
    out = {}
    for case, (agg, micro, minibatches, options) in enumerate(CASES):
        engine = ShardedTrainEngine(
            tiny_model(**MODEL), lr=1e-2, micro_batch_sequences=micro, **options
        )
        out[case] = _run(rank, engine, agg, minibatches)
    lora = ShardedTrainEngine.from_lora(tiny_model(**MODEL), r=4, lr=1e-2, micro_batch_sequences=3)
    out["lora"] = _run(rank, lora, "token_mean", 1)
    out["packed"] = sum(layouts)
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_ranks, 2)


def _plain(engine: TrainEngine, agg: str, minibatches: int):
    logprobs = engine.compute_logprobs(_batch())
    metrics = engine.train_batch(_batch(), _loss(agg), num_minibatches=minibatches)
    return logprobs, metrics, engine.state_dict_for_inference()


def _assert_same(got, expected) -> None:
    (logprobs, metrics, weights), (plain_lp, plain_metrics, plain_weights) = got, expected
    loss_tokens = _batch().loss_mask
    torch.testing.assert_close(logprobs[loss_tokens], plain_lp[loss_tokens], rtol=1e-5, atol=1e-5)
    assert metrics["steps"] == plain_metrics["steps"]
    assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-4)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-4, abs=1e-6)
    assert weights.keys() == plain_weights.keys()
    for key, value in plain_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_the_lean_forward_is_taken_and_packs_shared_prompts(ranks):
    for rank in ranks:
        assert rank["packed"] > 0  # every rank ran packed micro-batches


@pytest.mark.parametrize("case", range(len(CASES)))
def test_sharded_lean_forward_gives_the_unsharded_logprobs_and_update(ranks, case):
    agg, micro, minibatches, _ = CASES[case]
    plain = TrainEngine(tiny_model(**MODEL), lr=1e-2, micro_batch_sequences=micro)
    _assert_same(ranks[0][case], _plain(plain, agg, minibatches))
    before = tiny_model(**MODEL).state_dict()
    moved = max((ranks[0][case][2][k] - before[k]).abs().max() for k in before)
    assert moved > 1e-3  # the update is not a no-op


def test_sharded_lora_lean_forward_is_the_unsharded_one(ranks):
    plain = TrainEngine.from_lora(tiny_model(**MODEL), r=4, lr=1e-2, micro_batch_sequences=3)
    _assert_same(ranks[0]["lora"], _plain(plain, "token_mean", 1))

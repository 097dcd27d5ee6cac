"""ShardedTrainEngine on 1 and 2 gloo ranks (spawned processes on 127.0.0.1): the update
is the one an unsharded engine applies whatever the ranks' rows, the gathered publish is
the unsharded state dict, and the per-rank training state halves at 2 ranks."""

from __future__ import annotations

import pytest
import torch

from streamrl.algorithms import PolicyLossParams, make_rl_loss_fn
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.sharded import RankZero, ShardedTrainEngine, follow, rank_rows
from tests.sharded_harness import run_ranks
from tests.unit.engines.test_train_engine import make_batch, tiny_model

pytestmark = pytest.mark.slow  # spawned ranks: ~1 min on a loaded 2-core machine

# (aggregation, micro_batch_sequences, num_minibatches): 5 rows (the last without loss
# tokens) split 3/2 over 2 ranks, so each case has uneven rows per rank, and micro-batches
# of different sizes; the second gives rank 1 a micro-batch without loss tokens and an
# empty pass; the third two optimizer steps
CASES = [
    ("token_mean", 2, 1),
    ("seq_mean_token_mean", 1, 1),
    ("seq_mean_token_sum_norm", 2, 2),
]


def _loss(agg: str):
    return make_rl_loss_fn("ppo_clip", PolicyLossParams(agg_mode=agg, max_tokens=10))


def _engine(cls, micro: int, **kw):
    return cls(tiny_model(), lr=1e-2, micro_batch_sequences=micro, **kw)


def _train_cases(rank: int) -> list | None:
    """On every rank: each case's published weights before and after one train_batch,
    its metrics, and the log-probs before it (rank 0's; None on the others)."""
    out = []
    for agg, micro, minibatches in CASES:
        engine = _engine(ShardedTrainEngine, micro)
        if rank:
            follow(engine)
            continue
        trainer = RankZero(engine)
        before = trainer.state_dict_for_inference()
        logprobs = trainer.compute_logprobs(make_batch())
        metrics = trainer.train_batch(make_batch(), _loss(agg), num_minibatches=minibatches)
        out.append((before, logprobs, metrics, trainer.state_dict_for_inference()))
        trainer.stop()
    return out if rank == 0 else None


@pytest.fixture(scope="module")
def runs():
    """The cases on 1 rank and on 2 ranks (one spawn each)."""
    return {n: run_ranks(_train_cases, n)[0] for n in (1, 2)}


def _plain(agg: str, micro: int, minibatches: int):
    engine = _engine(TrainEngine, micro, head_on_targets=False, packed=False)
    metrics = engine.train_batch(make_batch(), _loss(agg), num_minibatches=minibatches)
    return metrics, engine.state_dict_for_inference()


def test_rank_rows_cover_the_batch_once_uneven_allowed():
    for n in (1, 2, 5, 8):
        for world in (1, 2, 3):
            parts = [rank_rows(n, r, world) for r in range(world)]
            assert torch.cat(parts).tolist() == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("case", range(len(CASES)))
def test_one_update_on_2_ranks_is_the_update_on_1_rank(runs, case):
    agg, micro, minibatches = CASES[case]
    plain_metrics, plain_weights = _plain(agg, micro, minibatches)
    for n in (1, 2):
        _, _, metrics, weights = runs[n][case]
        assert metrics["steps"] == minibatches
        # the normaliser: a per-rank or per-micro-batch one changes the gradient's norm
        assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-5)
        assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-5, abs=1e-7)
        assert weights.keys() == plain_weights.keys()
        for key, value in plain_weights.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6, msg=key)
    moved = max((runs[2][case][3][k] - runs[2][case][0][k]).abs().max() for k in plain_weights)
    assert moved > 1e-3  # the update is not a no-op


def test_gathered_publish_is_the_unsharded_state_dict(runs):
    plain = tiny_model().state_dict()
    for n in (1, 2):
        before = runs[n][0][0]
        assert before.keys() == plain.keys()
        for key, value in plain.items():
            assert torch.equal(before[key], value), key
            assert before[key].device.type == "cpu"


def test_logprobs_of_every_row_are_the_unsharded_ones(runs):
    batch = make_batch()
    engine = _engine(TrainEngine, 2, head_on_targets=False, packed=False)
    plain = engine.compute_logprobs(batch)
    real = batch.attention_mask  # beyond a row's length a log-prob is padding
    for n in (1, 2):
        got = runs[n][0][1]
        torch.testing.assert_close(got[real], plain[real], rtol=1e-5, atol=1e-6)


def test_training_state_per_rank_halves_at_2_ranks(runs):
    one, two = runs[1][0][2], runs[2][0][2]
    keys = ("param_bytes", "grad_bytes", "optim_bytes")
    total_1 = sum(one[f"rank0/{k}"] for k in keys)
    for rank in (0, 1):
        total_2 = sum(two[f"rank{rank}/{k}"] for k in keys)
        assert 0.45 < total_2 / total_1 <= 0.55
    assert two["rank1/peak_rss_bytes"] > 0


def _lora_ranks(rank: int):
    engine = ShardedTrainEngine.from_lora(tiny_model(), r=4, lr=1e-2, micro_batch_sequences=2)
    if rank:
        follow(engine)
        return None
    trainer = RankZero(engine)
    metrics = trainer.train_batch(make_batch(), _loss("token_mean"))
    reference = trainer.frozen_copy()
    ref_logprobs = trainer.compute_logprobs(make_batch(seed=2), reference)
    published = trainer.state_dict_for_inference()
    trainer.stop()
    return metrics, published, ref_logprobs


def test_lora_trains_publishes_and_copies_sharded_as_unsharded():
    metrics, published, ref_logprobs = run_ranks(_lora_ranks, 2)[0]
    plain = TrainEngine.from_lora(
        tiny_model(), r=4, lr=1e-2, micro_batch_sequences=2, head_on_targets=False, packed=False
    )
    plain_metrics = plain.train_batch(make_batch(), _loss("token_mean"))
    assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-5)
    expected = plain.state_dict_for_inference()
    assert published.keys() == expected.keys()  # the base model's names: adapters merged
    for key, value in expected.items():
        torch.testing.assert_close(published[key], value, rtol=1e-5, atol=1e-6, msg=key)
    batch = make_batch(seed=2)
    ref = plain.compute_logprobs(batch, plain.frozen_copy())
    real = batch.attention_mask
    torch.testing.assert_close(ref_logprobs[real], ref[real], rtol=1e-5, atol=1e-5)

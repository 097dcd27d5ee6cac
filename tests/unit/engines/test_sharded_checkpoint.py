"""Sharded checkpoints (DCP inside the atomic checkpoint directory): written by 2 ranks
and read by 1, written by 1 and read by 2, read by an unsharded engine, and an unsharded
engine's trainer.pt read by 2 ranks: the same weights and optimizer state each time, and
the next update the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamrl.algorithms import PolicyLossParams, make_rl_loss_fn
from streamrl.engines.train.dcp import full_state
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.sharded import RankZero, ShardedTrainEngine, follow
from streamrl.run.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tests.sharded_harness import run_ranks
from tests.unit.engines.test_train_engine import make_batch, tiny_model

pytestmark = pytest.mark.slow

LOSS = make_rl_loss_fn("ppo_clip", PolicyLossParams(agg_mode="token_mean"))


def _setup(engine):
    """The same engine shape everywhere: a value head (a trained extra) and a schedule."""
    engine.ensure_value_head()
    engine.reset_optimizer(1e-2, schedule="linear", warmup_steps=1, total_steps=10)


def _save(trainer, run_dir: Path, step: int) -> Path:
    write = getattr(trainer, "save_sharded", None)
    ckpt = Checkpoint("rl", step, trainer.checkpoint_state(), write_sharded=write)
    return save_checkpoint(run_dir, ckpt, keep=2)


def _ranks(rank: int, load_from: str | None, save_to: str | None):
    """Build (another init), load ``load_from`` or train a step, save to ``save_to``;
    rank 0 returns the full state then, and the weights after one more update."""
    engine = ShardedTrainEngine(tiny_model(seed=7), lr=1e-2, micro_batch_sequences=2)
    if rank:
        follow(engine)
        return None
    trainer = RankZero(engine)
    _setup(trainer)
    if load_from is None:
        trainer.train_batch(make_batch(), LOSS)
    else:
        trainer.load_checkpoint_state(load_checkpoint(Path(load_from)).trainer)
    if save_to is not None:
        _save(trainer, Path(save_to), 1)
    state = trainer.full_state()
    trainer.train_batch(make_batch(seed=3), LOSS)
    after = trainer.state_dict_for_inference()
    trainer.stop()
    return state, after, engine.global_step


def _plain() -> TrainEngine:
    engine = TrainEngine(
        tiny_model(seed=7), lr=1e-2, micro_batch_sequences=2, head_on_targets=False, packed=False
    )
    _setup(engine)
    return engine


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _assert_same(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)
        elif isinstance(a[key], list):
            assert len(a[key]) == len(b[key])
            for x, y in zip(a[key], b[key], strict=True):
                _assert_same(x, y) if isinstance(x, dict) else None
        else:
            assert a[key] == b[key], key


def test_dcp_checkpoints_reshard_2_to_1_and_1_to_2(tmp_path):
    (written, next_2, _) = run_ranks(_ranks, 2, None, str(tmp_path / "two"))[0]
    ckpt_2 = tmp_path / "two" / "checkpoints" / "rl-000001"
    assert (ckpt_2 / "trainer.dcp" / ".metadata").is_file()
    assert (tmp_path / "two" / "checkpoints" / "latest").read_text() == "rl-000001"
    assert written["optimizer"]["state"]  # Adam's moments are there to compare

    # 2 -> 1, and that 1-rank run writes a checkpoint of its own
    (on_1, next_1, step) = run_ranks(_ranks, 1, str(ckpt_2), str(tmp_path / "one"))[0]
    _assert_same(on_1, written)
    assert step == 2
    # 1 -> 2
    ckpt_1 = tmp_path / "one" / "checkpoints" / "rl-000001"
    (on_2, next_2b, _) = run_ranks(_ranks, 2, str(ckpt_1), None)[0]
    _assert_same(on_2, written)
    # the resumed runs' next update: the uninterrupted 2-rank run's
    _assert_same(next_1, next_2)
    _assert_same(next_2b, next_2)

    # DCP -> an unsharded engine (no process group)
    plain = _plain()
    plain.load_checkpoint_state(load_checkpoint(ckpt_2).trainer)
    _assert_same(full_state(plain), written)
    plain.train_batch(make_batch(seed=3), LOSS)
    _assert_same(plain.state_dict_for_inference(), next_2)

    # an unsharded engine's trainer.pt -> 2 ranks
    plain = _plain()
    plain.train_batch(make_batch(), LOSS)
    path = _save(plain, tmp_path / "plain", 1)
    assert not (path / "trainer.dcp").exists()
    (from_plain, _, _) = run_ranks(_ranks, 2, str(path), None)[0]
    _assert_same(from_plain, full_state(plain))

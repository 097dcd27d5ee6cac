"""Token-level PPO with a value head on the language model (algorithm.name: ppo)."""

from __future__ import annotations

import pytest
import torch

from streamrl.config import load_config
from streamrl.core.timing import StageTimer
from streamrl.core.types import Trajectory
from streamrl.run.launch import train
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of, metric_rows


def _traj(reward: float, mask: list[bool]) -> Trajectory:
    n = len(mask)
    return Trajectory(
        input_ids=torch.arange(1, n + 1),
        loss_mask=torch.tensor(mask),
        behavior_logprobs=torch.zeros(n),
        versions=torch.zeros(n, dtype=torch.long),
        reward=reward,
        item_index=0,
    )


class ValuesTrainer:
    """compute_values: V = 0.1 * position (a stand-in critic)."""

    value_head = object()

    def compute_values(self, batch):
        n, t = batch.input_ids.shape
        return 0.1 * torch.arange(t, dtype=torch.float32).expand(n, t)


def test_token_gae_rewards_the_last_generated_token_and_skips_observations():
    cfg = load_config(
        None, ["algorithm.name=ppo", "algorithm.ppo.gamma=1.0", "algorithm.ppo.gae_lambda=0.5"]
    )
    algo = algorithm_of(cfg)
    # prompt, two generated tokens, an observation token, one more generated token
    traj = _traj(1.0, [False, True, True, False, True])
    batch = algo.prepare([Group(0, 0, [traj])], ValuesTrainer(), StageTimer())
    v = {1: 0.1, 2: 0.2, 4: 0.4}  # values at the generated positions
    d4 = 1.0 - v[4]  # the outcome reward, terminal
    d2 = v[4] - v[2]  # the next generated token's value (the observation is skipped)
    d1 = v[2] - v[1]
    a4, a2 = d4, d2 + 0.5 * d4
    a1 = d1 + 0.5 * a2
    got = batch.advantages[0].tolist()
    assert got[0] == 0 and got[3] == 0  # prompt and observation tokens carry nothing
    assert (
        got[1] == pytest.approx(a1) and got[2] == pytest.approx(a2) and got[4] == pytest.approx(a4)
    )
    assert batch.returns[0, 4].item() == pytest.approx(1.0)  # R = A + V at the last token


def test_lm_value_head_trains_through_the_pipeline(tiny_config):
    cfg = tiny_config(
        "algorithm.name=ppo",
        "algorithm.ppo.gamma=1.0",
        "reward.components=[{name: numeric_match}, "
        "{name: format_reward, weight: 0.5, options: {pattern: '(?s).*[0-9].*'}}]",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "train.items_per_step=4",
        "train.steps=6",
        "train.lr=0.003",
    )
    result = train(cfg)
    head = result.trainer.value_head
    assert head is not None and head.weight.abs().sum() > 0  # it learned (zero at start)
    rows = metric_rows(result.run_dir)
    losses = [r["value_loss"] for r in rows if "value_loss" in r]
    assert len(losses) == 6 and all(x == x for x in losses)  # no NaN
    assert "time/values" in rows[1]

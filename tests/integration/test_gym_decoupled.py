"""Decoupled PPO on environment segments (``algorithm.decoupled`` with ``gae``): the
proximal policy is the clip centre of stale steps, weighted by pi_prox / pi_behave;
fresh steps (and eta = 0) are standard PPO, bit for bit."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

from streamrl.algorithms.actor_critic import actor_critic_loss
from streamrl.algorithms.losses import PolicyLossParams, decoupled_old_policy
from streamrl.config import load_config
from streamrl.core.timing import StageTimer
from streamrl.engines.train.policy import PolicyTrainEngine
from streamrl.models.policies import build_policy
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of
from tests.unit.rollout.test_gym import _segment


def _algo(*overrides: str):
    base = ["algorithm.name=ppo", "stream.max_staleness=1", "algorithm.ppo.vf_clip=0.5"]
    return algorithm_of(load_config(None, [*base, *overrides]))


def _trainer(seed: int = 0) -> PolicyTrainEngine:
    torch.manual_seed(seed)
    env = gym.make("StreamrlCounter-v0")
    return PolicyTrainEngine(build_policy("mlp", env.observation_space, env.action_space))


def _prepare(algo, trainer, version: int):
    """The batch of one segment played by weights version 4 (behaviour log-prob -0.5,
    value 10 * obs), prepared when the trainer's weights are ``version``."""
    algo.version = version
    seg = _segment("StreamrlCounter-v0", 6)
    return algo.prepare([Group(0, 0, [seg])], trainer, StageTimer())


def test_decoupled_surrogate_by_hand():
    # two transitions, clip 0.2, proximal log-probs 0 (the clip centre), no normalisation
    lp = torch.tensor([math.log(1.5), math.log(0.5)])  # ratios to pi_prox: 1.5, 0.5
    prox, adv = torch.zeros(2), torch.tensor([1.0, -1.0])
    v = torch.zeros(2)
    kw = dict(clip=0.2, vf_coef=0.0, vf_clip=None, entropy_coef=0.0, norm_advantages=False)
    w = torch.tensor([2.0, 0.5])  # pi_prox / pi_behave
    _, m = actor_critic_loss(lp, prox, adv, v, v, v, v, None, weights=w, **kw)
    # A=+1: -min(1.5, 1.2) = -1.2, times w 2 = -2.4
    # A=-1: max(-(-1)(0.5), -(-1)clip(0.5)) = max(0.5, 0.8) = 0.8, times w 0.5 = 0.4
    assert m["policy_loss"] == pytest.approx((-2.4 + 0.4) / 2)
    # w = 1 is standard PPO exactly: (-1.2 + 0.8) / 2
    std, m1 = actor_critic_loss(lp, prox, adv, v, v, v, v, None, **kw)
    ones, _ = actor_critic_loss(lp, prox, adv, v, v, v, v, None, weights=torch.ones(2), **kw)
    assert m1["policy_loss"] == pytest.approx(-0.2) and torch.equal(std, ones)


def test_proximal_weights_are_truncated_by_the_registered_correction():
    behave = torch.log(torch.tensor([0.25, 0.5, 0.8]))
    prox = torch.log(torch.tensor([0.5, 0.5, 0.4]))  # pi_prox / pi_behave = 2, 1, 0.5
    mask = torch.ones(3, dtype=torch.bool)
    old, w, m = decoupled_old_policy(
        behave, prox, mask, PolicyLossParams(is_correction="tis", is_cap=1.5)
    )
    assert torch.equal(old, prox)  # the clip centre is the proximal policy
    assert w.tolist() == pytest.approx([1.5, 1.0, 0.5])  # 2 truncated at the cap 1.5
    assert m["is/truncated_frac"] == pytest.approx(1 / 3)


def test_stale_steps_use_the_proximal_policy_and_critic():
    trainer = _trainer()
    batch = _prepare(
        _algo("algorithm.correction.kind=tis", "algorithm.correction.cap=1.1"), trainer, 5
    )
    now = trainer.evaluate(batch)
    assert torch.equal(batch.logprobs, now["logprobs"])  # clip centre: pi_prox, not -0.5
    assert torch.equal(batch.values, now["values"])  # the proximal critic, not 10 * obs
    expected = (now["logprobs"] + 0.5).exp().clamp(max=1.1)  # pi_prox / pi_behave, capped
    assert torch.allclose(batch.weights, expected)
    assert not torch.allclose(batch.weights, torch.ones_like(batch.weights))


@pytest.mark.parametrize("overrides", [[], ["stream.max_staleness=0"]])
def test_fresh_steps_and_eta_0_are_standard_ppo_bit_for_bit(overrides: list[str]):
    trainers, batches = [], []
    for decoupled in ("true", "false"):
        trainer = _trainer()
        algo = _algo(f"algorithm.decoupled={decoupled}", *overrides)
        batch = _prepare(algo, trainer, 4)  # the segment's version is the trainer's
        trainer.train_batch(batch, algo.loss_fn, epochs=3)
        trainers.append(trainer)
        batches.append(batch)
    assert batches[0].weights is None and torch.equal(batches[0].logprobs, batches[1].logprobs)
    for p, q in zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True):
        assert torch.equal(p, q)
    # eta = 0 never takes the proximal forward, whatever the versions say
    assert _prepare(_algo("stream.max_staleness=0"), _trainer(), 9).weights is None


def test_the_trainer_version_is_checkpointed():
    algo = _algo()
    _prepare(algo, _trainer(), 7)
    restored = _algo()
    restored.load_state_dict(algo.state_dict())
    assert restored.version == 8  # the weights after the update that batch fed

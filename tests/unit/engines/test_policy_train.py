"""The policy train engine's cheaper optimizer step computes what torch's does."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms.actor_critic import actor_critic_loss
from streamrl.engines.train.policy import PolicyTrainEngine


@pytest.mark.parametrize("max_norm", [0.5, 100.0, math.inf])
def test_gradient_clipping_matches_clip_grad_norm_bit_for_bit(max_norm: float):
    torch.manual_seed(0)
    engine = PolicyTrainEngine(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
    grads = [torch.randn_like(p) for p in engine.trainable]
    for p, g in zip(engine.trainable, grads, strict=True):
        p.grad = g.clone()
    ours = engine.clip_gradients(max_norm)
    ours_grads = [p.grad.clone() for p in engine.trainable]
    for p, g in zip(engine.trainable, grads, strict=True):
        p.grad = g.clone()
    theirs = torch.nn.utils.clip_grad_norm_(engine.trainable, max_norm)
    assert torch.equal(ours, theirs)
    for a, b in zip(ours_grads, (p.grad for p in engine.trainable), strict=True):
        assert torch.equal(a, b)


def test_clipping_without_gradients_is_a_zero_norm():
    engine = PolicyTrainEngine(torch.nn.Linear(2, 1))
    assert engine.clip_gradients(1.0).item() == 0.0


def test_unmasked_loss_equals_the_masked_one():
    # the mask-free path (fused reductions) against the general masked formulas
    torch.manual_seed(1)
    lp, old, adv, v, old_v, ret, ent = (torch.randn(16) for _ in range(7))
    kw = dict(clip=0.2, vf_coef=0.5, vf_clip=0.3, entropy_coef=0.01, norm_advantages=True)
    fast, m_fast = actor_critic_loss(lp, old, adv, v, old_v, ret, ent, None, **kw)
    full = torch.ones(16, dtype=torch.bool)
    slow, m_slow = actor_critic_loss(lp, old, adv, v, old_v, ret, ent, full, **kw)
    assert fast.item() == pytest.approx(slow.item(), rel=1e-5)
    for k, x in m_slow.items():
        assert m_fast[k] == pytest.approx(x, rel=1e-5, abs=1e-6), k

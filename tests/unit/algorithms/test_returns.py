"""GAE, V-trace and the actor-critic loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms.actor_critic import actor_critic_loss
from streamrl.algorithms.returns import gae, next_values, vtrace

F, T = False, True


def col(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype)[:, None]  # (T, 1)


def test_next_values_bootstrap_within_episode_at_ends_and_after_the_segment():
    values = col(1.0, 2.0, 3.0)
    done = col(F, T, F, dtype=torch.bool)
    nv = next_values(values, torch.tensor([9.0]), col(0.0, 7.0, 0.0), done)
    # step 0 -> values[1]; step 1 ended -> its final value; step 2 -> the segment's tail
    assert nv[:, 0].tolist() == [2.0, 7.0, 9.0]


def test_gae_truncation_bootstraps_termination_does_not():
    r, v = col(1.0, 1.0, 1.0), col(0.5, 0.5, 0.5)
    gamma, lam = 0.9, 0.8
    # episode A ends at step 1 (truncated: V(final obs) = 2.0 counts), B starts at step 2
    nv = col(0.5, 2.0, 0.25)
    term, trunc = col(F, F, F, dtype=torch.bool), col(F, T, F, dtype=torch.bool)
    adv, ret = gae(r, v, nv, term, trunc, gamma=gamma, lam=lam)
    d2 = 1 + 0.9 * 0.25 - 0.5  # 0.725, B's own step
    d1 = 1 + 0.9 * 2.0 - 0.5  # 2.3: bootstrapped from the truncated episode's final value
    d0 = 1 + 0.9 * 0.5 - 0.5  # 0.95
    expected = [d0 + gamma * lam * d1, d1, d2]  # no flow from B into A (done at step 1)
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, adv + v)
    # the same step terminated instead: no bootstrap
    adv_t, _ = gae(r, v, nv, trunc, term, gamma=gamma, lam=lam)
    assert adv_t[1, 0].item() == pytest.approx(1 - 0.5)
    assert adv_t[0, 0].item() == pytest.approx(d0 + gamma * lam * 0.5)


def test_gae_lambda_one_is_the_discounted_return_minus_value():
    r, v = col(1.0, 2.0, 3.0), col(0.0, 0.0, 0.0)
    done = col(F, F, F, dtype=torch.bool)
    nv = next_values(v, torch.tensor([10.0]), torch.zeros_like(v), done)
    adv, _ = gae(r, v, nv, done, done, gamma=0.5, lam=1.0)
    # 1 + .5*2 + .25*3 + .125*10
    assert adv[0, 0].item() == pytest.approx(1 + 1 + 0.75 + 1.25)


def test_vtrace_on_policy_equals_lambda_one_returns():
    r, v = col(1.0, 0.0, 2.0), col(0.3, -0.2, 0.7)
    done = col(F, F, F, dtype=torch.bool)
    nv = next_values(v, torch.tensor([1.5]), torch.zeros_like(v), done)
    lp = col(-0.7, -0.1, -2.0)
    vs, pg = vtrace(lp, lp, r, v, nv, done, done, gamma=0.9)
    adv, ret = gae(r, v, nv, done, done, gamma=0.9, lam=1.0)
    torch.testing.assert_close(vs, ret)
    # pg_adv_t = r_t + gamma v_{t+1} - V(s_t)
    expected = torch.stack([r[t] + 0.9 * (vs[t + 1] if t < 2 else nv[2]) - v[t] for t in range(3)])
    torch.testing.assert_close(pg, expected)


def test_vtrace_clips_importance_weights_by_hand():
    # one step, then the segment ends: v_0 = V + rho (r + gamma V' - V)
    r, v, nv = col(1.0), col(0.5), col(2.0)
    done = col(F, dtype=torch.bool)
    behave, target = col(math.log(0.25)), col(math.log(0.75))  # pi / mu = 3
    vs, pg = vtrace(behave, target, r, v, nv, done, done, gamma=0.9, rho_bar=1.0)
    delta = 1 + 0.9 * 2.0 - 0.5
    assert vs[0, 0].item() == pytest.approx(0.5 + 1.0 * delta)  # rho capped at 1
    vs2, pg2 = vtrace(behave, target, r, v, nv, done, done, gamma=0.9, rho_bar=2.0)
    assert vs2[0, 0].item() == pytest.approx(0.5 + 2.0 * delta)
    assert pg2[0, 0].item() == pytest.approx(2.0 * delta)
    # c cuts the trace: with c_bar small, v_0 hardly sees step 1's correction
    r2, v2 = col(0.0, 1.0), col(0.0, 0.0)
    d2 = col(F, F, dtype=torch.bool)
    nv2 = next_values(v2, torch.tensor([0.0]), torch.zeros_like(v2), d2)
    lp = col(0.0, 0.0)
    vs_cut, _ = vtrace(lp, lp, r2, v2, nv2, d2, d2, gamma=1.0, c_bar=0.0)
    assert vs_cut[0, 0].item() == pytest.approx(0.0)  # r_0 + V(s_1) - V(s_0) = 0, trace cut
    vs_full, _ = vtrace(lp, lp, r2, v2, nv2, d2, d2, gamma=1.0, c_bar=1.0)
    assert vs_full[0, 0].item() == pytest.approx(1.0)


def test_actor_critic_loss_by_hand():
    mask = torch.tensor([True, True, False])
    lp = torch.tensor([math.log(1.5), 0.0, 99.0])  # ratios 1.5 and 1 (third masked)
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 5.0])
    values, old_v, ret = (
        torch.tensor([2.0, 0.0, 0.0]),
        torch.tensor([1.0, 0.0, 0.0]),
        torch.zeros(3),
    )
    ent = torch.tensor([0.5, 0.7, 9.0])
    loss, m = actor_critic_loss(
        lp,
        old,
        adv,
        values,
        old_v,
        ret,
        ent,
        mask,
        clip=0.2,
        vf_coef=0.5,
        vf_clip=None,
        entropy_coef=0.1,
        norm_advantages=False,
    )
    # policy: -min(1.5*1, 1.2*1) = -1.2 ; -min(1*-1, 1*-1) = 1 -> mean -0.1
    # value: 0.5 * mean((2-0)^2, 0) = 1.0 ; entropy mean 0.6
    assert m["policy_loss"] == pytest.approx(-0.1)
    assert m["value_loss"] == pytest.approx(1.0)
    assert loss.item() == pytest.approx(-0.1 + 0.5 * 1.0 - 0.1 * 0.6)
    # value clipping: V may move only 0.5 from the old value: max((2-0)^2, (1.5-0)^2)
    _, m2 = actor_critic_loss(
        lp,
        old,
        adv,
        values,
        old_v,
        ret,
        ent,
        mask,
        clip=0.2,
        vf_coef=0.5,
        vf_clip=0.5,
        entropy_coef=0.0,
        norm_advantages=False,
    )
    assert m2["value_loss"] == pytest.approx(1.0)  # the unclipped error is larger here
    _, m3 = actor_critic_loss(
        lp,
        old,
        adv,
        torch.tensor([0.2, 0.0, 0.0]),
        old_v,
        ret,
        ent,
        mask,
        clip=0.2,
        vf_coef=0.5,
        vf_clip=0.5,
        entropy_coef=0.0,
        norm_advantages=False,
    )
    assert m3["value_loss"] == pytest.approx(0.5 * 0.5 * 0.5**2)  # clipped to 0.5: (0.5)^2
    # advantage normalisation: zero mean, unit (unbiased) std over the mask
    _, m4 = actor_critic_loss(
        torch.zeros(3),
        old,
        torch.tensor([3.0, 1.0, 7.0]),
        values,
        old_v,
        ret,
        ent,
        mask,
        clip=0.2,
        vf_coef=0.0,
        vf_clip=None,
        entropy_coef=0.0,
        norm_advantages=True,
    )
    assert m4["policy_loss"] == pytest.approx(0.0, abs=1e-6)

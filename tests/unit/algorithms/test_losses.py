"""Losses against hand-computed values and gradients."""

import math
import pickle

import pytest
import torch

from streamrl.algorithms import (
    PolicyLossParams,
    aggregate,
    broadcast_to_tokens,
    get_policy_loss,
    kl_penalty,
    loss_weight,
    make_rl_loss_fn,
    sft_loss,
)
from streamrl.core.types import Batch

NAN = float("nan")


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, t(expected), atol=atol, rtol=0)


def leaf(x):
    return t(x).requires_grad_(True)


# ----------------------------------------------------------------------------- aggregation

VALUES = t([[1.0, 2.0, 3.0, 100.0], [4.0, NAN, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_aggregation_modes_by_hand():
    # masked values (100, NaN, a whole empty row) are ignored
    close(aggregate(VALUES, MASK, "token_mean"), 10 / 4)  # (1+2+3+4) / 4 tokens
    close(aggregate(VALUES, MASK, "seq_mean_token_mean"), (2.0 + 4.0) / 2)  # empty row not counted
    close(aggregate(VALUES, MASK, "seq_mean_token_sum_norm", max_tokens=4), (6 / 4 + 4 / 4) / 2)
    assert loss_weight(MASK, "token_mean") == 4
    assert loss_weight(MASK, "seq_mean_token_mean") == 2
    close(aggregate(VALUES, torch.zeros_like(MASK), "token_mean"), 0.0)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(VALUES, MASK, "bogus")
    with pytest.raises(ValueError, match="max_tokens"):
        PolicyLossParams(agg_mode="seq_mean_token_sum_norm")


# ----------------------------------------------------------------------------- PPO clip

PPO_RATIO = [1.5, 0.5, 1.1, 0.7, 1.5]
PPO_ADV = [1.0, -1.0, 1.0, 1.0, -1.0]


def test_ppo_clip_values_and_which_tokens_keep_gradient():
    behave = t([[-1.0] * 5])
    logp = leaf([[-1.0 + math.log(r) for r in PPO_RATIO]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, m = get_policy_loss("ppo_clip")(
        logp, behave, t([PPO_ADV]), mask, params=PolicyLossParams()
    )
    # per token -min(rA, clip(r, .8, 1.28) A):
    #   r=1.5 A=+1 -> -1.28 (clipped: too far up) | r=.5 A=-1 -> +.8 (clipped: too far down)
    #   r=1.1 A=+1 -> -1.1 | r=.7 A=+1 -> -.7 (below 1-eps but A>0: not clipped)
    #   r=1.5 A=-1 -> +1.5 (wrong side: never clipped)
    close(loss, (-1.28 + 0.8 - 1.1 - 0.7 + 1.5) / 5)
    loss.backward()
    # d loss / d logp_t = -A r / 5 where unclipped, exactly 0 where clipped
    close(logp.grad, [[0.0, 0.0, -1.1 / 5, -0.7 / 5, 1.5 / 5]])
    assert m["clip_frac"] == pytest.approx(2 / 5)
    assert m["ratio_mean"] == pytest.approx(5.3 / 5)
    assert m["approx_kl"] > 0


def test_ppo_clip_masked_padding_cannot_poison_loss():
    behave = t([[-1.0, -1.0, 0.0]])
    logp = leaf([[-1.0, -1.0, -1e4]])  # padding with an absurd value
    mask = torch.tensor([[True, True, False]])
    loss, _ = get_policy_loss("ppo_clip")(logp, behave, t([[1.0, 1.0, NAN]]), mask)
    loss.backward()
    close(loss, -1.0)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0


def test_decoupled_weights_and_capping():
    # prox/behave weights 2, 1, 10; ratio vs prox is 1 -> loss_t = -w A
    prox = t([[-1.0, -2.0, -0.5]])
    behave = prox - t([[math.log(2.0), 0.0, math.log(10.0)]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = t([[1.0, 1.0, 1.0]])
    fn = get_policy_loss("ppo_clip")

    logp = leaf(prox.tolist())
    loss, m = fn(logp, behave, adv, mask, proximal_logprobs=prox, params=PolicyLossParams())
    close(loss, -(2 + 1 + 10) / 3)
    assert m["behave_weight_mean"] == pytest.approx(13 / 3, rel=1e-5)

    logp = leaf(prox.tolist())
    params = PolicyLossParams(behave_imp_weight_cap=5.0)
    loss, m = fn(logp, behave, adv, mask, proximal_logprobs=prox, params=params)
    close(loss, -(2 + 1 + 0) / 3)  # capped token weighs 0 but stays in the denominator
    assert m["capped_frac"] == pytest.approx(1 / 3)
    loss.backward()
    close(logp.grad, [[-2 / 3, -1 / 3, 0.0]])


def test_decoupled_ratio_is_against_proximal_not_behaviour():
    behave = t([[-1.0]])
    prox = t([[-1.0 - math.log(1.5)]])  # pi_theta / pi_prox = 1.5, pi_theta / pi_behave = 1
    logp = leaf([[-1.0]])
    loss, m = get_policy_loss("ppo_clip")(
        logp, behave, t([[1.0]]), torch.tensor([[True]]), proximal_logprobs=prox
    )
    close(loss, -1.28 / 1.5)  # clipped at 1.28, weighted by pi_prox/pi_behave = 1/1.5
    assert m["clip_frac"] == 1.0
    loss.backward()
    assert logp.grad.item() == 0.0


# ----------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_by_hand():
    behave = torch.zeros(2, 3)
    # seq 0: token log-ratios .1, .3 -> s = e^.2 = 1.2214 > 1.0004 with A > 0 -> clipped
    # seq 1: log-ratios ln2, -ln2, 0 -> s = 1 (token ratio 2 would be clipped by PPO; not here)
    logp = leaf([[0.1, 0.3, 9.0], [math.log(2), -math.log(2), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = t([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    # agg_mode is ignored: GSPO is always a mean over sequences of token means
    loss, m = get_policy_loss("gspo")(logp, behave, adv, mask, params=PolicyLossParams())
    close(loss, (-1.0004 + -2.0) / 2)
    assert m["seq_ratio_mean"] == pytest.approx((math.exp(0.2) + 1.0) / 2, rel=1e-5)
    loss.backward()
    # seq 1: d/dlogp_t = -(1/2 seqs)(1/3 tokens) s A = -1/3 for every token
    close(logp.grad, [[0.0, 0.0, 0.0], [-1 / 3, -1 / 3, -1 / 3]])


# ----------------------------------------------------------------------------- CISPO


def test_cispo_keeps_every_gradient_with_capped_detached_weight():
    ratios, adv = [1.5, 10.0, 0.5], t([[1.0, 1.0, -1.0]])
    behave = torch.full((1, 3), -3.0)
    logp = leaf([[-3.0 + math.log(r) for r in ratios]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = get_policy_loss("cispo")(logp, behave, adv, mask, params=PolicyLossParams())
    # weights sg(min(r, 1 + 4)) = 1.5, 5, .5; loss = mean(-w A logp)
    close(loss, 1.844101)
    loss.backward()
    # gradient -w A / 3 only through log pi (through the ratio it would be -A r (1 + logp) / 3)
    close(logp.grad, [[-1.5 / 3, -5.0 / 3, 0.5 / 3]])
    assert m["clip_frac"] == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------- KL, entropy, SFT


def test_kl_estimators_by_hand():
    ln2 = math.log(2.0)
    logp, ref = t([[ln2, -ln2, 0.3]]), t([[0.0, 0.0, 0.3]])  # log_r = ln2, -ln2, 0
    close(kl_penalty(logp, ref, "k1"), [[ln2, -ln2, 0.0]])
    close(kl_penalty(logp, ref, "k2"), [[0.240227, 0.240227, 0.0]])
    # k3 = exp(ref - logp) - (ref - logp) - 1: .5 + ln2 - 1 and 2 - ln2 - 1
    close(kl_penalty(logp, ref, "k3"), [[0.193147, 0.306853, 0.0]])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k9")


def _batch(n=2, t_len=3, **kw):
    mask = torch.ones(n, t_len, dtype=torch.bool)
    mask[:, 0] = False
    fields = dict(
        input_ids=torch.zeros(n, t_len, dtype=torch.long),
        attention_mask=torch.ones(n, t_len, dtype=torch.bool),
        loss_mask=mask,
        behavior_logprobs=torch.full((n, t_len), -1.0),
        versions=torch.zeros(n, t_len, dtype=torch.long),
        rewards=torch.zeros(n),
        item_index=torch.zeros(n, dtype=torch.long),
        advantages=torch.where(mask, 1.0, 0.0),
    )
    fields.update(kw)
    return Batch(**fields)


def test_rl_loss_adds_kl_and_subtracts_entropy():
    batch = _batch(ref_logprobs=torch.full((2, 3), -1.0 - math.log(2.0)))
    logp = torch.full((2, 3), -1.0)  # on-policy: ratio 1, policy loss = -mean(A) = -1
    entropy = leaf([[9.0, 1.0, 2.0], [9.0, 3.0, 4.0]])  # position 0 is masked
    fn = make_rl_loss_fn("ppo_clip", kl_coef=0.5, kl_kind="k3", entropy_coef=0.1)
    loss, m = fn({"logprobs": logp, "entropy": entropy}, batch)
    # k3 with log_r = ln2 is .193147; mean entropy over loss tokens is 2.5
    close(loss, -1.0 + 0.5 * 0.193147 - 0.1 * 2.5)
    assert m["kl_ref"] == pytest.approx(0.193147, abs=1e-5) and m["entropy"] == 2.5
    loss.backward()
    # bonus sign: descending the loss raises entropy
    close(entropy.grad, [[0.0, -0.025, -0.025], [0.0, -0.025, -0.025]])
    assert fn.needs_entropy and not make_rl_loss_fn("ppo_clip").needs_entropy


def test_rl_loss_errors_and_takes_only_token_advantages():
    outputs = {"logprobs": torch.full((2, 3), -1.0)}
    with pytest.raises(ValueError, match="ref_logprobs"):
        make_rl_loss_fn("ppo_clip", kl_coef=0.1)(outputs, _batch())
    with pytest.raises(ValueError, match="advantages"):
        make_rl_loss_fn("ppo_clip")(outputs, _batch(advantages=None))
    with pytest.raises(KeyError, match="ppo_clip"):
        make_rl_loss_fn("ppo")
    with pytest.raises(ValueError, match="per-token"):  # one place broadcasts: prepare()
        make_rl_loss_fn("ppo_clip")(outputs, _batch(advantages=t([2.0, -1.0])))
    mask = _batch().loss_mask
    adv = broadcast_to_tokens(t([2.0, -1.0]), mask)
    loss, _ = make_rl_loss_fn("ppo_clip")(outputs, _batch(advantages=adv))
    close(loss, -(2.0 * 2 - 1.0 * 2) / 4)


def test_rl_loss_pickles_for_process_backends():
    fn = make_rl_loss_fn("cispo", kl_coef=0.1)
    assert pickle.loads(pickle.dumps(fn)) == fn


def test_gspo_pins_sequence_aggregation_for_all_terms():
    fn = make_rl_loss_fn("gspo", PolicyLossParams(agg_mode="token_mean"))
    assert fn.params.agg_mode == "seq_mean_token_mean"
    assert fn.loss_weight(_batch(n=3)) == 3  # sequences, not tokens


def test_sft_loss_token_mean_nll():
    logp = t([[0.0, -1.0, -2.0], [0.0, -3.0, -7.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    loss, m = sft_loss({"logprobs": logp}, _batch(loss_mask=mask))
    close(loss, (1 + 2 + 3) / 3)
    assert m["nll"] == 2.0


def test_proximal_from_current_equals_separate_proximal_pass() -> None:
    """With one optimizer step per batch the proximal policy is the current one:
    taking its logprobs from the training forward gives the same loss and gradient."""
    torch.manual_seed(0)
    n, t = 3, 5
    logits = torch.randn(n, t, requires_grad=True)
    logprobs = torch.nn.functional.logsigmoid(logits)
    mask = torch.rand(n, t) > 0.3
    batch = Batch(
        input_ids=torch.zeros(n, t, dtype=torch.long),
        attention_mask=torch.ones(n, t, dtype=torch.bool),
        loss_mask=mask,
        behavior_logprobs=logprobs.detach() + 0.1 * torch.randn(n, t),
        versions=torch.zeros(n, t, dtype=torch.long),
        rewards=torch.zeros(n),
        item_index=torch.zeros(n, dtype=torch.long),
        advantages=torch.randn(n, t),
    )
    implicit = make_rl_loss_fn("ppo_clip", proximal_from_current=True)
    loss_a, _ = implicit({"logprobs": logprobs}, batch)
    (grad_a,) = torch.autograd.grad(loss_a, logits, retain_graph=True)
    batch.proximal_logprobs = logprobs.detach().clone()
    loss_b, _ = make_rl_loss_fn("ppo_clip")({"logprobs": logprobs}, batch)
    (grad_b,) = torch.autograd.grad(loss_b, logits)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)

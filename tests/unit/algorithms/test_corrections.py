"""Train/inference mismatch corrections and metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms import PolicyLossParams, make_rl_loss_fn
from streamrl.algorithms.corrections import get_correction, mismatch_metrics
from streamrl.core.types import Batch

W = torch.tensor([[0.25, 0.8, 1.5, 4.0]])
M = torch.tensor([[True, True, True, False]])  # the last token is not a loss token


@pytest.mark.parametrize(
    ("name", "expected", "frac_key", "frac"),
    [
        ("none", [0.25, 0.8, 1.5, 4.0], None, None),
        ("tis", [0.25, 0.8, 1.2, 1.2], "is/truncated_frac", 1 / 3),
        ("mis", [0.25, 0.8, 0.0, 0.0], "is/masked_frac", 1 / 3),
        ("icepop", [0.0, 0.8, 0.0, 0.0], "is/masked_frac", 2 / 3),
    ],
)
def test_corrections_by_hand(name, expected, frac_key, frac):
    out, metrics = get_correction(name)(W, M, cap=1.2, band=(0.5, 1.2))
    assert out[0].tolist() == pytest.approx(expected)
    if frac_key:  # counted over loss tokens only
        assert metrics[frac_key] == pytest.approx(frac)


def test_unknown_correction_is_named():
    with pytest.raises(KeyError, match="unknown importance-sampling correction 'tiss'"):
        PolicyLossParams(is_correction="tiss")


def test_mismatch_metrics_use_the_newest_weights_tokens():
    trainer = torch.tensor([[-1.0, -1.0, -2.0]])
    behave = torch.tensor([[-1.0, -1.0 - math.log(2.0), -9.0]])
    versions = torch.tensor([[3, 3, 2]])  # the last token came from older weights
    mask = torch.ones(1, 3, dtype=torch.bool)
    m = mismatch_metrics(trainer, behave, versions, mask)
    # ratios 1 and 2 on the version-3 tokens; k3 = (r - 1 - log r): 0 and 1 - log 2
    assert m["mismatch/ratio_mean"] == pytest.approx(1.5)
    assert m["mismatch/ratio_max"] == pytest.approx(2.0) and m["mismatch/ratio_min"] == 1.0
    assert m["mismatch/kl"] == pytest.approx((1 - math.log(2.0)) / 2)


def test_a_tiny_mismatch_is_not_cancelled_to_zero():
    """log r = 3e-5 per token (fp16 engine weights): k3 = e^x - 1 - x = x^2/2 + x^3/6 + ...
    is 4.5e-10, below float32's resolution of r - 1."""
    x = 3e-5
    trainer = torch.tensor([[-1.0 + x, -2.0 + x]])
    behave = torch.tensor([[-1.0, -2.0]])
    lr = float((trainer - behave)[0, 0])  # the float32 difference actually seen
    m = mismatch_metrics(trainer, behave, torch.zeros(1, 2, dtype=torch.long), M[:, :2])
    assert m["mismatch/kl"] == pytest.approx(math.expm1(lr) - lr, rel=0.05)
    assert m["mismatch/kl"] == pytest.approx(x * x / 2, rel=0.2)


def test_the_rl_loss_reports_mismatch_and_applies_the_correction():
    n, t = 1, 3
    mask = torch.tensor([[False, True, True]])
    batch = Batch(
        input_ids=torch.zeros(n, t, dtype=torch.long),
        attention_mask=torch.ones(n, t, dtype=torch.bool),
        loss_mask=mask,
        behavior_logprobs=torch.tensor([[0.0, -1.0, -1.0 - math.log(4.0)]]),
        versions=torch.zeros(n, t, dtype=torch.long),
        rewards=torch.zeros(n),
        item_index=torch.zeros(n, dtype=torch.long),
        advantages=torch.where(mask, 1.0, 0.0),
    )
    logp = torch.full((n, t), -1.0)  # the trainer: pi_prox / pi_behave = 1 and 4
    outputs = {"logprobs": logp}
    loss_fn = make_rl_loss_fn(
        "ppo_clip",
        PolicyLossParams(is_correction="tis", is_cap=2.0),
        proximal_from_current=True,
    )
    loss, m = loss_fn(outputs, batch)
    assert m["mismatch/ratio_max"] == pytest.approx(4.0)
    # on-policy ratio 1: loss_t = -w_t * A_t with w = (1, min(4, 2)) -> mean -1.5
    assert loss.item() == pytest.approx(-1.5)

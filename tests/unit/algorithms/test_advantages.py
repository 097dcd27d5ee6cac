"""Advantage estimators against hand-computed values."""

import inspect

import pytest
import torch

from streamrl.algorithms import (
    UnknownNameError,
    advantage_names,
    broadcast_to_tokens,
    get_advantage,
)

R = torch.tensor([1.0, 0.0, 1.0, 1.0])
G = torch.tensor([0, 0, 1, 1])


def adv(name, rewards, groups, **kw):
    return get_advantage(name)(torch.as_tensor(rewards), torch.as_tensor(groups), **kw)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0
    )


def test_grpo_two_groups():
    # group 0: mean .5, unbiased std sqrt(.5) -> +-.5/.70711; group 1 has zero variance -> 0
    close(adv("grpo", R, G), [0.70711, -0.70711, 0.0, 0.0])
    # one group of three: mean 2, std 1
    close(adv("grpo", [1.0, 2.0, 3.0], [5, 5, 5]), [-1.0, 0.0, 1.0])


def test_grpo_without_std_equals_dr_grpo():
    close(adv("grpo", R, G, normalize_std=False), [0.5, -0.5, 0.0, 0.0])
    close(adv("dr_grpo", R, G), [0.5, -0.5, 0.0, 0.0])


def test_rloo_leave_one_out():
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -.5; 2 - 4 = -2; 4 - 2 = 2
    close(adv("rloo", [1.0, 0.0, 0.0, 2.0, 4.0], [0, 0, 0, 1, 1]), [1.0, -0.5, -0.5, -2.0, 2.0])


def test_reinforce_pp_batch_whitening():
    # mean .75; deviations (.25, -.75, .25, .25); unbiased var .75 / 3 = .25 -> std .5
    close(adv("reinforce_pp", R, G), [0.5, -1.5, 0.5, 0.5])


def test_reinforce_pp_baseline():
    # group-centred (.5, -.5, 0, 0); mean 0; unbiased var .5 / 3 -> std .40825
    close(adv("reinforce_pp_baseline", R, G), [1.22474, -1.22474, 0.0, 0.0])


def test_remax_subtracts_greedy_baseline():
    close(
        adv("remax", [1.0, 0.0, 1.0], [0, 1, 2], baseline=torch.tensor([1.0, 1.0, 0.0])), [0, -1, 1]
    )
    with pytest.raises(ValueError, match="baseline"):
        adv("remax", [1.0, 0.0], [0, 1])


def test_non_contiguous_group_ids_and_integer_rewards():
    close(adv("dr_grpo", torch.tensor([3, 1, 0, 0]), [7, 7, 2, 2]), [1.0, -1.0, 0.0, 0.0])


def _sequence_level() -> list[str]:
    """The estimators over (rewards, groups) alone; the others declare what they need."""
    return [n for n in advantage_names() if not get_advantage(n).needs]


def test_every_declared_input_is_a_keyword_the_estimator_requires():
    for name in advantage_names():
        params = inspect.signature(get_advantage(name)).parameters
        for need in get_advantage(name).needs:
            assert params[need].kind is inspect.Parameter.KEYWORD_ONLY, (name, need)
            assert params[need].default is inspect.Parameter.empty, (name, need)
        required = {
            k
            for k, p in params.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
        }
        assert required == set(get_advantage(name).needs), name


@pytest.mark.parametrize("name", _sequence_level())
def test_singletons_and_constant_groups_are_finite(name):
    kw = {"baseline": torch.zeros(5)} if name == "remax" else {}
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 1, 2, 2, 2])  # two singletons, one zero-variance group
    out = adv(name, rewards, groups, **kw)
    assert out.shape == (5,) and torch.isfinite(out).all()
    single = adv(name, [1.0], [0], **({"baseline": torch.zeros(1)} if name == "remax" else {}))
    assert torch.isfinite(single).all()


def test_group_baselines_give_zero_for_singletons_and_constant_groups():
    for name in ("grpo", "dr_grpo", "rloo"):
        close(adv(name, [1.0, 0.0, 1.0, 1.0], [0, 1, 2, 2]), [0.0, 0.0, 0.0, 0.0])
    close(adv("reinforce_pp", [3.0], [0]), [0.0])


def test_unknown_name_lists_known():
    with pytest.raises(KeyError, match="grpo"):
        get_advantage("nope")
    with pytest.raises(ValueError):  # also a ValueError
        get_advantage("nope")
    assert issubclass(UnknownNameError, KeyError)


def test_broadcast_to_tokens():
    mask = torch.tensor([[False, True, True], [False, False, True]])
    close(broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask), [[0, 2, 2], [0, 0, -1]])

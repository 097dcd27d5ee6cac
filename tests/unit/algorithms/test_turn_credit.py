"""Turn-level credit (turn_discounted, gigpo) and role-conditioned advantages (rae),
against values computed by hand."""

from __future__ import annotations

import pytest
import torch

from streamrl.algorithms import build_algorithm
from streamrl.algorithms.role_conditioned import rae
from streamrl.algorithms.turn_credit import (
    gigpo,
    spread_over_turns,
    turn_discounted,
    turn_returns,
    turn_tensors,
)
from streamrl.config import RunContext, load_config
from streamrl.core.types import Batch, Trajectory

# Two trajectories of one item: A has 2 turns (rewards 0.5, 1.0), B 3 (0, -1, 2).
TURN_REWARDS = torch.tensor([[0.5, 1.0, 0.0], [0.0, -1.0, 2.0]])
TURN_MASK = torch.tensor([[True, True, False], [True, True, True]])
ITEM = torch.tensor([7, 7])


def test_turn_returns_discount_per_turn():
    # gamma 0.5: A: G1 = 1, G0 = 0.5 + 0.5; B: G2 = 2, G1 = -1 + 1, G0 = 0 + 0
    expected = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    assert torch.allclose(turn_returns(TURN_REWARDS, TURN_MASK, 0.5), expected)


def test_turn_discounted_subtracts_the_groups_mean_at_each_turn_index():
    adv = turn_discounted(
        torch.tensor([1.5, 1.0]), ITEM, turn_rewards=TURN_REWARDS, turn_mask=TURN_MASK, gamma=0.5
    )
    # turn 0: mean(1, 0) = 0.5; turn 1: mean(1, 0) = 0.5; turn 2: B alone
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]]))


def test_turn_discounted_keeps_groups_apart():
    adv = turn_discounted(
        torch.tensor([1.5, 1.0]),
        torch.tensor([1, 2]),
        turn_rewards=TURN_REWARDS,
        turn_mask=TURN_MASK,
        gamma=0.5,
    )
    assert torch.allclose(adv, torch.zeros(2, 3))  # each alone in its group


def test_gigpo_adds_the_anchor_state_advantage_to_the_episodes():
    # states: both start at state 0; A's second turn is state 1, B's are states 2 and 3
    states = torch.tensor([[0, 1, -1], [0, 2, 3]])
    adv = gigpo(
        torch.tensor([1.5, 1.0]),
        ITEM,
        turn_rewards=TURN_REWARDS,
        turn_mask=TURN_MASK,
        turn_states=states,
        gamma=0.5,
        step_weight=1.0,
        normalize_std=False,
    )
    # episode: 1.5 - 1.25 = 0.25, -0.25; state 0: returns 1 and 0, mean 0.5 -> +-0.5;
    # states seen once: 0
    assert torch.allclose(adv, torch.tensor([[0.75, 0.25, 0.0], [-0.75, -0.25, -0.25]]))


def test_spread_gives_each_token_its_turns_advantage():
    index = torch.tensor([[-1, 0, 0, -1, 1, -1]])
    out = spread_over_turns(torch.tensor([[2.0, -3.0]]), index)
    assert out.tolist() == [[0.0, 2.0, 2.0, 0.0, -3.0, 0.0]]


def _traj(reward, spans, turn_rewards, keys, role, n=8) -> Trajectory:
    mask = torch.zeros(n, dtype=torch.bool)
    for a, b in spans:
        mask[a:b] = True
    meta = {"turn_spans": spans, "turn_rewards": turn_rewards, "turn_keys": keys, "role_key": role}
    return Trajectory(
        input_ids=torch.arange(1, n + 1),
        loss_mask=mask,
        behavior_logprobs=torch.where(mask, -1.0, 0.0),
        versions=torch.where(mask, 0, -1),
        reward=reward,
        item_index=7,
        metadata=meta,
    )


def test_turn_tensors_read_the_episodes_metadata_and_a_single_turn_answer():
    plain = Trajectory(
        input_ids=torch.arange(1, 6),
        loss_mask=torch.tensor([False, False, True, True, False]),
        behavior_logprobs=torch.zeros(5),
        versions=torch.zeros(5, dtype=torch.long),
        reward=2.0,
        item_index=7,
    )
    multi = _traj(1.0, [(1, 3), (5, 7)], [0.25, 0.75], ["s", "t"], "g/seat_0")
    rewards, mask, index, states = turn_tensors([multi, plain], 8)
    assert rewards.tolist() == [[0.25, 0.75], [2.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, False]]
    assert index.tolist() == [[-1, 0, 0, -1, -1, 1, 1, -1], [-1, -1, 0, 0, -1, -1, -1, -1]]
    assert states[0, 0] != states[0, 1] and states[1, 1] == -1


def test_rae_keeps_a_baseline_per_role():
    adv, after = rae(
        torch.tensor([1.0, -1.0, 1.0]),
        ITEM.new_tensor([7, 7, 7]),
        roles=torch.tensor([0, 1, 0]),
        baselines=torch.zeros(2),
        decay=0.5,
    )
    # b0: 0 -> 0.5 (A 0.5) -> 0.75 (A 0.25); b1: 0 -> -0.5 (A -0.5)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.25]))
    assert torch.allclose(after, torch.tensor([0.75, -0.5]))


def _algorithm(tmp_path, advantage: str, *extra: str):
    cfg = load_config(
        None,
        [
            "model.name_or_path=tiny-small",
            f"algorithm.name={advantage}",
            f"run.output_dir={tmp_path}",
            *extra,
        ],
    )
    return build_algorithm(cfg.algorithm, RunContext.of(cfg))


def test_rae_algorithm_carries_its_baselines_across_batches_and_checkpoints(tmp_path):
    algo = _algorithm(tmp_path, "rae", "algorithm.rae.decay=0.5")
    seat0 = _traj(1.0, [(2, 4)], [1.0], ["s"], "kuhn/seat_0")
    seat1 = _traj(-1.0, [(2, 4)], [-1.0], ["s"], "kuhn/seat_1")
    # an all-equal group still has signal against the roles' baselines: kept
    assert algo.finish_group([seat0, seat0], {}) == [seat0, seat0]
    batch = Batch.collate([seat0, seat1], pad_id=0)
    assert algo.advantages(batch, [seat0, seat1]).tolist() == [0.5, -0.5]
    saved = algo.state_dict()
    again = _algorithm(tmp_path, "rae", "algorithm.rae.decay=0.5")
    again.load_state_dict(saved)
    assert again.advantages(batch, [seat0, seat1]).tolist() == [0.25, -0.25]
    assert algo.advantages(batch, [seat0, seat1]).tolist() == [0.25, -0.25]


@pytest.mark.parametrize("advantage", ["turn_discounted", "gigpo"])
def test_turn_algorithms_put_turn_advantages_on_generated_tokens_only(tmp_path, advantage):
    algo = _algorithm(tmp_path, advantage, "algorithm.turn.gamma=0.5", "rollout.group_size=2")
    a = _traj(1.5, [(1, 3), (5, 7)], [0.5, 1.0], ["s0", "s1"], "g")
    b = _traj(-0.5, [(1, 3), (4, 6)], [0.0, -0.5], ["s0", "s2"], "g")
    batch = Batch.collate([a, b], pad_id=0)
    tokens = algo.token_advantages(batch, [a, b])
    assert (tokens[~batch.loss_mask] == 0).all()
    # per turn, constant over its tokens; the two turn-0s are opposite (same state/index)
    assert tokens[0, 1] == tokens[0, 2] and tokens[0, 1] == -tokens[1, 1] != 0

"""Turn-level credit for multi-turn episodes: per-turn rewards become per-token advantages.

A multi-turn trajectory (``streamrl.core.turns``) has K turns, each a span of generated
tokens with the reward the environment credited to it. Two estimators, both pure tensor
functions over (N, K) turn tensors, both group-relative (the trajectories of one item
form a group):

- ``turn_discounted``: the discounted return from each turn, G_k = r_k + gamma G_{k+1},
  minus the mean return from the same turn index over the group's trajectories that
  reached it (a baseline that depends on the turn only). A turn is credited with what
  followed it, not with what came before.
- ``gigpo`` (GiGPO, Feng et al. 2025): an episode-level GRPO advantage on the returns,
  plus ``step_weight`` times a step-level one: turns of the group that start from the
  same state (``turn_keys``, an anchor state) are compared by their discounted returns,
  normalised within that state's group. A state seen once adds nothing.

:func:`spread_over_turns` gives every token of a turn its turn's advantage. The
Algorithm (``algorithm.name: turn_discounted | gigpo``) reads the turns from the
trajectories' metadata and ``algorithm.turn.*`` for gamma and the step weight.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algorithms.advantages import group_stats, grpo
from streamrl.algorithms.base import register_algorithm
from streamrl.algorithms.policy_gradient import PolicyGradient, sample_weights
from streamrl.algorithms.registry import register_advantage
from streamrl.core.turns import TURN_KEYS, TURN_REWARDS, TURN_SPANS
from streamrl.core.types import Batch, Trajectory


def turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns from each turn: (N, K), (N, K) bool -> (N, K), 0 where masked.

    G_k = r_k + gamma * G_{k+1} over each row's turns (turns are left-aligned)."""
    out = torch.zeros_like(turn_rewards, dtype=torch.float32)
    running = torch.zeros(turn_rewards.shape[0])
    for k in reversed(range(turn_rewards.shape[1])):
        running = torch.where(turn_mask[:, k], turn_rewards[:, k] + gamma * running, 0.0)
        out[:, k] = running
    return out


def _keyed_stats(
    values: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of ``values`` over the valid entries sharing a key:
    (N, K) each -> (N, K), (N, K) (0 where masked)."""
    mean = torch.zeros_like(values)
    std = torch.zeros_like(values)
    if bool(mask.any()):
        m, s, _ = group_stats(values[mask], keys[mask])
        mean[mask], std[mask] = m, s
    return mean, std


@register_advantage("turn_discounted", group_relative=True, needs=("turn_rewards", "turn_mask"))
def turn_discounted(
    rewards: torch.Tensor,
    item_index: torch.Tensor,
    *,
    turn_rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    gamma: float = 1.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_{i,k} = G_{i,k} - mean{G_{j,k} : j in i's group, j has a turn k}. -> (N, K)."""
    returns = turn_returns(turn_rewards.float(), turn_mask, gamma)
    _, group = torch.unique(item_index, return_inverse=True)  # (N,)
    k = torch.arange(turn_mask.shape[1])
    keys = group[:, None] * turn_mask.shape[1] + k[None, :]  # (group, turn index)
    mean, _ = _keyed_stats(returns, turn_mask, keys)
    return torch.where(turn_mask, returns - mean, 0.0)


@register_advantage(
    "gigpo", group_relative=True, needs=("turn_rewards", "turn_mask", "turn_states")
)
def gigpo(
    rewards: torch.Tensor,
    item_index: torch.Tensor,
    *,
    turn_rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    turn_states: torch.Tensor,
    gamma: float = 1.0,
    step_weight: float = 1.0,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_{i,k} = A^E_i + w A^S_{i,k} -> (N, K).

    A^E: GRPO on the trajectory rewards (N,). A^S: the discounted return from turn k
    against the others of the group that start a turn from the same state
    (``turn_states`` (N, K) long ids), divided by their std unless not
    ``normalize_std``; a state seen once in its group gives 0."""
    episode = grpo(rewards, item_index, eps=eps, normalize_std=normalize_std)
    returns = turn_returns(turn_rewards.float(), turn_mask, gamma)
    _, group = torch.unique(item_index, return_inverse=True)
    _, state = torch.unique(turn_states, return_inverse=True)  # dense ids
    keys = group[:, None] * (int(state.max()) + 1) + state  # (group, anchor state)
    mean, std = _keyed_stats(returns, turn_mask, keys)
    step = returns - mean
    if normalize_std:
        step = step / (std + eps)
    return torch.where(turn_mask, episode[:, None] + step_weight * step, 0.0)


def spread_over_turns(turn_adv: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """(N, K) turn advantages -> (N, T): token t gets its turn's, ``turn_index`` (N, T)
    long the turn of each token (-1 outside every turn: 0)."""
    picked = turn_adv.gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, picked, 0.0)


def turn_tensors(
    trajectories: list[Trajectory], length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the trajectories' turn metadata (a trajectory without it is one turn: its
    generated tokens, its reward): turn rewards (N, K), turn mask (N, K) bool, each
    token's turn (N, length) long (-1 outside), each turn's state id (N, K) long."""
    spans, rewards, states, ids = [], [], [], {}
    for t in trajectories:
        s = t.metadata.get(TURN_SPANS)
        if s is None:
            gen = t.loss_mask.nonzero().squeeze(-1)
            s = [(int(gen[0]), int(gen[-1]) + 1)] if gen.numel() else []
        spans.append(s)
        rewards.append(t.metadata.get(TURN_REWARDS, [t.reward] * len(s)))
        keys = t.metadata.get(TURN_KEYS, [f"turn-{k}" for k in range(len(s))])
        states.append([ids.setdefault(key, len(ids)) for key in keys])
    n, k_max = len(trajectories), max([len(s) for s in spans] + [1])
    turn_rewards, turn_states = torch.zeros(n, k_max), torch.full((n, k_max), -1)
    turn_mask = torch.zeros(n, k_max, dtype=torch.bool)
    turn_index = torch.full((n, length), -1, dtype=torch.long)
    for i, (s, r, st) in enumerate(zip(spans, rewards, states, strict=True)):
        turn_rewards[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        turn_states[i, : len(st)] = torch.tensor(st, dtype=torch.long)
        turn_mask[i, : len(s)] = True
        for k, (a, b) in enumerate(s):
            turn_index[i, a:b] = k
    return turn_rewards, turn_mask, turn_index, turn_states


@register_algorithm("turn_discounted")
class TurnCredit(PolicyGradient):
    """Policy gradient with per-turn advantages (``turn_discounted``);
    ``algorithm.turn.gamma`` discounts across turns."""

    def turn_options(self, states: torch.Tensor) -> dict[str, Any]:
        """The estimator's options beyond the turn rewards and mask."""
        return {"gamma": self.cfg.turn.gamma}

    def token_advantages(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor:
        rewards, mask, index, states = turn_tensors(trajectories, batch.input_ids.shape[1])
        adv = self.advantage_fn(
            batch.rewards,
            batch.item_index,
            turn_rewards=rewards,
            turn_mask=mask,
            **self.turn_options(states),
        )  # (N, K)
        tokens = spread_over_turns(adv, index) * sample_weights(trajectories)[:, None]
        return torch.where(batch.loss_mask, tokens, 0.0)


@register_algorithm("gigpo")
class GiGPO(TurnCredit):
    """GiGPO: ``algorithm.turn.step_weight`` weighs the step-level term of anchor states."""

    def turn_options(self, states: torch.Tensor) -> dict[str, Any]:
        return {
            **super().turn_options(states),
            "turn_states": states,
            "step_weight": self.cfg.turn.step_weight,
        }

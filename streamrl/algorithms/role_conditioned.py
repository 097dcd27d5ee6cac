"""Role-conditioned advantage estimation (RAE, SPIRAL: Liu et al. 2025) for self-play.

When one policy plays every seat of a zero-sum game, a seat's expected return is not 0:
the first mover of Kuhn Poker or TicTacToe has an edge. A single baseline would credit
seat 0's trajectories with seat 0's edge. RAE keeps one baseline per (game, role), an
exponential moving average of that role's returns, and takes each trajectory's
advantage against its own role's baseline::

    b[role] <- decay * b[role] + (1 - decay) * R      (for each trajectory, in batch order)
    A       =  R - b[role]                             (with the baseline just updated)

Baselines start at 0 and are part of the algorithm's checkpointed state, so a resumed
run continues them exactly. ``algorithm.name: rae``; ``algorithm.rae.decay`` is the
decay. A trajectory's role is its ``role_key`` (``streamrl.core.turns``), e.g.
``KuhnPoker-v0/seat_1``.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algorithms.base import register_algorithm
from streamrl.algorithms.policy_gradient import PolicyGradient
from streamrl.algorithms.registry import register_advantage
from streamrl.config import AlgorithmConfig, RunContext
from streamrl.core.turns import ROLE_KEY
from streamrl.core.types import Batch, Trajectory


@register_advantage("rae", needs=("roles", "baselines"))
def rae(
    rewards: torch.Tensor,
    item_index: torch.Tensor,
    *,
    roles: torch.Tensor,
    baselines: torch.Tensor,
    decay: float = 0.95,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (N,), updated baselines (R,)) from rewards (N,), each trajectory's role
    ``roles`` (N,) long in [0, R) and the roles' baselines (R,); see the module docstring.
    ``baselines`` is not modified."""
    if roles.shape != rewards.shape:
        raise ValueError(f"rae: roles {tuple(roles.shape)} and rewards {tuple(rewards.shape)}")
    b = baselines.clone().double()
    adv = torch.zeros(rewards.shape[0], dtype=torch.float64)
    for i, (r, role) in enumerate(zip(rewards.double().tolist(), roles.tolist(), strict=True)):
        b[role] = decay * b[role] + (1.0 - decay) * r
        adv[i] = r - b[role]
    return adv.to(torch.float32), b.to(baselines.dtype)


@register_algorithm("rae")
class RoleConditioned(PolicyGradient):
    """Policy gradient with RAE's per-role baselines (kept across steps, checkpointed)."""

    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        self.baselines: dict[str, float] = {}

    def finish_group(
        self, samples: list[Trajectory], extras: dict[str, Trajectory]
    ) -> list[Trajectory]:
        """Every group is kept: a group whose rewards are all equal still has advantages
        against its roles' baselines (dynamic sampling is for group-relative estimators)."""
        return samples

    def advantages(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor:
        keys = [str(t.metadata.get(ROLE_KEY, "")) for t in trajectories]
        names = sorted(set(self.baselines) | set(keys))
        roles = torch.tensor([names.index(k) for k in keys], dtype=torch.long)
        before = torch.tensor([self.baselines.get(k, 0.0) for k in names], dtype=torch.float64)
        adv, after = rae(
            batch.rewards,
            batch.item_index,
            roles=roles,
            baselines=before,
            decay=self.cfg.rae.decay,
        )
        self.baselines = dict(zip(names, after.tolist(), strict=True))
        return adv

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "role_baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.baselines = dict(state.get("role_baselines", {}))

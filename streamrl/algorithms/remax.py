"""ReMax: REINFORCE with the reward of a greedy rollout as the baseline.

Each item gets one extra greedy rollout (never trained on); every sample's
advantage is its reward minus that greedy reward (Li et al., 2023).
"""

from __future__ import annotations

import torch

from streamrl.algorithms.base import ExtraRollout, Filtered, register_algorithm
from streamrl.algorithms.policy_gradient import PolicyGradient
from streamrl.algorithms.registry import register_advantage
from streamrl.core.types import Batch, Trajectory


@register_advantage("remax")
def remax(
    rewards: torch.Tensor,
    item_index: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_i = r_i - b_i, b_i the reward of a greedy rollout of the same prompt. (N,) -> (N,)."""
    if baseline is None:
        raise ValueError(
            "remax needs baseline= (N,): the reward of a greedy (temperature 0) rollout "
            "for each trajectory's prompt"
        )
    if baseline.shape != rewards.shape:
        raise ValueError(
            f"remax baseline has shape {tuple(baseline.shape)}, rewards {tuple(rewards.shape)}"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    return r - baseline.to(r.dtype)


@register_algorithm("remax")
class ReMax(PolicyGradient):
    extra_rollouts = (ExtraRollout("baseline", greedy=True),)

    def finish_group(
        self, samples: list[Trajectory], extras: dict[str, Trajectory]
    ) -> list[Trajectory] | Filtered:
        for t in samples:
            t.metadata["baseline_reward"] = extras["baseline"].reward
        return super().finish_group(samples, extras)

    def advantages(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor:
        baseline = torch.tensor([t.metadata["baseline_reward"] for t in trajectories])
        return remax(batch.rewards, batch.item_index, baseline=baseline)

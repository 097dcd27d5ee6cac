"""Outcome-reward advantage estimators: one scalar per trajectory.

Every estimator has the signature

    fn(rewards: (N,), group_ids: (N,), *, baseline: (N,) | None = None, eps: float = 1e-6) -> (N,)

where trajectories sharing a ``group_id`` answered the same prompt. Standard
deviations are unbiased (Bessel-corrected, as in verl and TRL). A group of size one
has no peer to compare against, so its mean is its own reward (advantage 0 under
group baselines) and its std is 0; zero-variance groups give 0, never NaN.
``broadcast_to_tokens`` turns the result into the (N, T) advantages a ``Batch`` holds.
"""

from __future__ import annotations

import torch

from streamrl.algorithms.registry import register_advantage


def _as_float(rewards: torch.Tensor) -> torch.Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


def group_stats(
    x: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element statistics of the element's group.

    x: (N,) float, group_ids: (N,) int -> (mean (N,), unbiased std (N,), group size (N,)).
    Uses a one-hot matmul rather than scatter-add so the result is deterministic on
    every device.
    """
    if x.numel() == 0:
        return x, x, x
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (N,) in [0, G)
    onehot = (inverse[:, None] == torch.arange(int(inverse.max()) + 1, device=x.device)).to(x.dtype)
    count = onehot.sum(0)  # (G,)
    mean = (x @ onehot) / count  # (G,)
    sq_dev = ((x - mean[inverse]) ** 2) @ onehot  # (G,)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()  # singleton groups: 0 / 1 = 0
    return mean[inverse], std[inverse], count[inverse]


def whiten(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean) / (std + eps) over the whole batch; (N,) -> (N,). N == 1 gives 0."""
    std = x.std() if x.numel() > 1 else x.new_zeros(())
    return (x - x.mean()) / (std + eps)


@register_advantage("grpo")
def grpo(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps); without the division if not ``normalize_std``."""
    r = _as_float(rewards)
    mean, std, _ = group_stats(r, group_ids)
    return (r - mean) / (std + eps) if normalize_std else r - mean


@register_advantage("dr_grpo")
def dr_grpo(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Dr. GRPO: A_i = r_i - mean_g (the std division biases towards easy/hard prompts)."""
    return grpo(rewards, group_ids, eps=eps, normalize_std=False)


@register_advantage("rloo")
def rloo(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g); singleton groups -> 0."""
    r = _as_float(rewards)
    mean, _, n = group_stats(r, group_ids)
    return (r - mean) * n / (n - 1).clamp(min=1)


@register_advantage("reinforce_pp")
def reinforce_pp(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++: rewards whitened over the whole batch, groups ignored."""
    return whiten(_as_float(rewards), eps)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the batch."""
    r = _as_float(rewards)
    mean, _, _ = group_stats(r, group_ids)
    return whiten(r - mean, eps)


@register_advantage("remax")
def remax(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """ReMax: A_i = r_i - b_i, b_i the reward of a greedy rollout of the same prompt."""
    if baseline is None:
        raise ValueError(
            "remax needs baseline= (N,): the reward of a greedy (temperature 0) rollout "
            "for each trajectory's prompt"
        )
    if baseline.shape != rewards.shape:
        raise ValueError(
            f"remax baseline has shape {tuple(baseline.shape)}, rewards {tuple(rewards.shape)}"
        )
    return _as_float(rewards) - baseline.to(_as_float(rewards).dtype)


def broadcast_to_tokens(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(N,) sequence advantages -> (N, T) token advantages, zero where ``loss_mask`` is False."""
    return torch.where(loss_mask, advantages[:, None], 0.0)

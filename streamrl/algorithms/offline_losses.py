"""Losses of the offline algorithms: pure tensor functions, registered by name.

All tensors are (M,) over the M transitions of a minibatch unless said otherwise;
``terminated`` is bool (no bootstrap from a terminal next state). The algorithms in
:mod:`streamrl.algorithms.offline` run the networks and pass the tensors in:

- ``bc``: behaviour cloning, the negative log-likelihood of the logged actions
  (categorical for discrete actions, the diagonal Gaussian for continuous ones);
- ``expectile``: IQL's value loss, an upper expectile of Q(s, a) - V(s);
- ``iql_q``: IQL's TD loss of both Q-networks against r + gamma V(s');
- ``awr``: IQL's policy extraction, advantage-weighted regression with weights
  exp(beta A) capped at ``max_weight``;
- ``td3_critic``: TD3's twin-critic loss against the clipped double-Q target
  (:func:`td3_target`, with target policy smoothing :func:`smoothed_actions`);
- ``td3_bc_actor``: TD3+BC's actor loss, -lambda Q(s, pi(s)) + (pi(s) - a)^2 with
  lambda = alpha / mean |Q|.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from streamrl.algorithms.registry import _get, _register

F = TypeVar("F", bound=Callable)
_OFFLINE_LOSSES: dict[str, Callable] = {}


def register_offline_loss(name: str) -> Callable[[F], F]:
    """Register a pure offline loss under ``name``."""
    return _register(_OFFLINE_LOSSES, "offline loss", name)


def get_offline_loss(name: str) -> Callable:
    return _get(_OFFLINE_LOSSES, "offline loss", name)


def offline_loss_names() -> list[str]:
    return sorted(_OFFLINE_LOSSES)


@register_offline_loss("bc")
def bc_loss(logprobs: torch.Tensor) -> torch.Tensor:
    """-mean(log pi(a | s)) over the logged actions. logprobs (M,) -> scalar.

    >>> round(float(bc_loss(torch.log(torch.tensor([0.5, 0.25])))), 4)
    1.0397
    """
    return -logprobs.mean()


@register_offline_loss("expectile")
def expectile_loss(q: torch.Tensor, v: torch.Tensor, expectile: float) -> torch.Tensor:
    """mean(|tau - 1(u < 0)| u^2) with u = q - v, tau = ``expectile``; ``q`` is a target
    (no gradient flows into it). q, v (M,) -> scalar.

    tau > 0.5 weights positive residuals more, so V approaches an upper expectile of Q
    over the dataset's actions: a max over in-distribution actions without querying
    any action outside the data.
    """
    u = q.detach() - v
    weight = torch.where(u < 0, 1.0 - expectile, expectile)
    return (weight * u.square()).mean()


@register_offline_loss("iql_q")
def iql_q_loss(
    q1: torch.Tensor,
    q2: torch.Tensor,
    rewards: torch.Tensor,
    next_v: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
) -> torch.Tensor:
    """Mean over both networks of mean((Q_i - y)^2), y = r + gamma (1 - d) V(s') (no
    gradient into y). q1, q2, rewards, next_v (M,), terminated (M,) bool -> scalar."""
    y = (rewards + gamma * (~terminated).float() * next_v).detach()
    return 0.5 * ((q1 - y).square().mean() + (q2 - y).square().mean())


@register_offline_loss("awr")
def awr_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor, *, beta: float, max_weight: float
) -> torch.Tensor:
    """-mean(min(exp(beta A), max_weight) log pi(a | s)), the weights held constant.
    logprobs, advantages (M,) -> scalar."""
    weights = (beta * advantages.detach()).exp().clamp(max=max_weight)
    return -(weights * logprobs).mean()


def awr_weight_stats(
    advantages: torch.Tensor, *, beta: float, max_weight: float
) -> dict[str, float]:
    """How concentrated the weights min(exp(beta A), max_weight) of a minibatch are:
    their mean, the fraction at the cap, and the effective sample size as a fraction
    of the minibatch, (sum w)^2 / (M sum w^2) (1 = uniform weights, as BC; 1/M = all
    the weight on one transition)."""
    w = (beta * advantages.detach().double()).exp().clamp(max=max_weight)
    return {
        "awr_weight_mean": float(w.mean()),
        "awr_weight_capped": float((w >= max_weight).double().mean()),
        "awr_ess": float(w.sum().square() / (w.numel() * w.square().sum())),
    }


def td3_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    *,
    gamma: float,
) -> torch.Tensor:
    """y = r + gamma (1 - d) min(Q1'(s', a'), Q2'(s', a')) (M,), without gradient."""
    return (rewards + gamma * (~terminated).float() * torch.minimum(next_q1, next_q2)).detach()


def smoothed_actions(
    mean: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    *,
    noise: float,
    noise_clip: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Target policy smoothing: clip(mean + clip(noise * N(0, 1) * scale, +-noise_clip *
    scale), low, high), with scale the half-width of the action box (TD3's noise is
    relative to max_action). mean (M, A); low, high (A,)."""
    scale = (high - low) / 2
    eps = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device) * noise
    eps = eps.clamp(-noise_clip, noise_clip) * scale
    return torch.maximum(torch.minimum(mean + eps, high), low)


@register_offline_loss("td3_critic")
def td3_critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean((Q1 - y)^2) + mean((Q2 - y)^2), as TD3 and TD3+BC. (M,) each -> scalar."""
    y = target.detach()
    return (q1 - y).square().mean() + (q2 - y).square().mean()


@register_offline_loss("td3_bc_actor")
def td3_bc_actor_loss(
    q_pi: torch.Tensor, pi_actions: torch.Tensor, actions: torch.Tensor, *, alpha: float
) -> torch.Tensor:
    """-lambda mean(Q(s, pi(s))) + mean((pi(s) - a)^2), lambda = alpha / mean|Q(s, pi(s))|
    held constant (TD3+BC's normalisation makes alpha independent of the reward scale).
    q_pi (M,); pi_actions, actions (M, A) -> scalar."""
    lam = alpha / q_pi.abs().mean().detach().clamp(min=1e-6)
    return -lam * q_pi.mean() + (pi_actions - actions).square().mean()

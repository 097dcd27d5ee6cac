"""The Tinker API's built-in losses (``forward_backward(data, loss_fn=...)``), as defined in
Tinker's documentation, on streamrl's policy losses where the definitions agree.

Every tensor is (N, T): N datums, T positions, ``mask`` True on a datum's real positions
(False on padding). Position t of a datum holds the log-prob its model input assigns to
``target_tokens[t]``; the losses are *sums* over every datum and position (Tinker does not
normalise: a weight or an advantage of 0 is what leaves a position out):

- ``cross_entropy``:       -sum(weights * logp)
- ``importance_sampling``: -sum(r * A),                  r = exp(logp - sampling_logp)
- ``ppo``:                 -sum(min(r * A, clip(r, lo, hi) * A)),  lo, hi = 0.8, 1.2
- ``cispo``:               -sum(sg[clip(r, lo, hi)] * A * logp),   lo, hi = 0.0, 4.0

``lo`` and ``hi`` are ``loss_fn_config``'s ``clip_low_threshold`` / ``clip_high_threshold``
(absolute ratios, not epsilons). PPO and importance sampling are streamrl's ``ppo_clip``
(importance sampling: with bounds that never bind), CISPO is streamrl's ``cispo`` (its
ratio is never negative, so the lower bound 0 is implied; a positive one is refused);
their token mean times the token count is the sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from streamrl.algorithms.losses import PolicyLossParams, cispo, ppo_clip

Inputs = dict[str, torch.Tensor]


class LossInputError(ValueError):
    """The caller's inputs or config do not fit the loss (one line naming the field)."""


@dataclass(frozen=True)
class TinkerLoss:
    fn: Callable[[torch.Tensor, Inputs, torch.Tensor, dict[str, float]], torch.Tensor]
    inputs: tuple[str, ...]  # loss_fn_inputs it needs besides target_tokens
    config: dict[str, float]  # loss_fn_config keys it takes, with their defaults


def _cross_entropy(
    logprobs: torch.Tensor, inputs: Inputs, mask: torch.Tensor, config: dict[str, float]
) -> torch.Tensor:
    return -torch.where(mask, inputs["weights"] * logprobs, 0.0).sum()


def _summed(policy_loss: Callable, params: PolicyLossParams) -> Callable:
    def loss(
        logprobs: torch.Tensor, inputs: Inputs, mask: torch.Tensor, config: dict[str, float]
    ) -> torch.Tensor:
        mean, _ = policy_loss(
            logprobs, inputs["logprobs"], inputs["advantages"], mask, params=params
        )
        return mean * mask.sum()

    return loss


def _importance_sampling(
    logprobs: torch.Tensor, inputs: Inputs, mask: torch.Tensor, config: dict[str, float]
) -> torch.Tensor:
    # clip(r, 1 - 1, 1 + inf) = r: min(r A, r A) = r A
    params = PolicyLossParams(clip_low=1.0, clip_high=math.inf)
    return _summed(ppo_clip, params)(logprobs, inputs, mask, config)


def _ppo(
    logprobs: torch.Tensor, inputs: Inputs, mask: torch.Tensor, config: dict[str, float]
) -> torch.Tensor:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    params = PolicyLossParams(clip_low=1.0 - low, clip_high=high - 1.0)
    return _summed(ppo_clip, params)(logprobs, inputs, mask, config)


def _cispo(
    logprobs: torch.Tensor, inputs: Inputs, mask: torch.Tensor, config: dict[str, float]
) -> torch.Tensor:
    if config["clip_low_threshold"] > 0:
        raise LossInputError(
            "loss_fn_config.clip_low_threshold: cispo is served with no lower bound "
            "(0, the default)"
        )
    params = PolicyLossParams(cispo_clip_high=config["clip_high_threshold"] - 1.0)
    return _summed(cispo, params)(logprobs, inputs, mask, config)


_RL = ("logprobs", "advantages")
_CLIPS = ("clip_low_threshold", "clip_high_threshold")

TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(_cross_entropy, ("weights",), {}),
    "importance_sampling": TinkerLoss(_importance_sampling, _RL, {}),
    "ppo": TinkerLoss(_ppo, _RL, dict(zip(_CLIPS, (0.8, 1.2), strict=True))),
    "cispo": TinkerLoss(_cispo, _RL, dict(zip(_CLIPS, (0.0, 4.0), strict=True))),
}


def tinker_loss(
    name: str,
    logprobs: torch.Tensor,
    inputs: Inputs,
    mask: torch.Tensor,
    config: dict[str, float | str] | None = None,
) -> torch.Tensor:
    """The summed loss ``name`` of (N, T) ``logprobs`` (carrying the gradient)."""
    return resolve(name, inputs, config)(logprobs, inputs, mask)


def resolve(
    name: str, inputs: Inputs | set[str], config: dict[str, float | str] | None
) -> Callable[[torch.Tensor, Inputs, torch.Tensor], torch.Tensor]:
    """Checks ``name``, the inputs it needs and its config; LossInputError otherwise.
    Returns the loss of (logprobs, inputs, mask) with the config bound."""
    loss = TINKER_LOSSES.get(name)
    if loss is None:
        raise LossInputError(
            f"loss_fn {name!r} is not served; served: {', '.join(TINKER_LOSSES)} "
            "(forward_backward_custom runs any other loss on top of cross_entropy)"
        )
    missing = [k for k in ("target_tokens", *loss.inputs) if k not in inputs]
    if missing:
        raise LossInputError(f"loss_fn {name!r} needs loss_fn_inputs {', '.join(missing)}")
    given = dict(config or {})
    unknown = sorted(set(given) - set(loss.config))
    if unknown:
        known = ", ".join(loss.config) or "none"
        raise LossInputError(
            f"loss_fn_config {', '.join(unknown)}: not a key of {name!r} (known: {known})"
        )
    values = dict(loss.config)
    for k, v in given.items():
        if isinstance(v, str) or not math.isfinite(v):
            raise LossInputError(f"loss_fn_config.{k}: expected a finite number, got {v!r}")
        values[k] = float(v)
    return lambda logprobs, inputs, mask: loss.fn(logprobs, inputs, mask, values)

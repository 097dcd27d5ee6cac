"""Preference losses (DPO, IPO): pure tensor functions registered by name, and
:class:`DPOLoss`, the ``loss_fn(outputs, batch)`` the train engine calls in the DPO stage.

A preference loss has the signature

    fn(chosen_logratio (P,), rejected_logratio (P,), *, beta) -> (losses (P,), metrics)

for P pairs, where ``logratio = log pi_theta(y | x) - log pi_ref(y | x)`` is summed over the
completion's tokens (a completion is one action) and pi_ref is the frozen reference: the
policy at the start of the stage. ``margin = chosen_logratio - rejected_logratio``;
``beta * logratio`` is DPO's implicit reward.

- ``sigmoid`` (DPO, Rafailov et al. 2023): ``-log sigmoid(beta * margin)``;
- ``ipo`` (IPO, Azar et al. 2023): ``(margin - 1 / (2 beta))^2``, which regresses the
  margin to a finite target instead of pushing it to infinity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from streamrl.algorithms.registry import _get, _register
from streamrl.core.loss import LossFn
from streamrl.core.types import Batch

F_ = TypeVar("F_", bound=Callable)
_PREFERENCE_LOSSES: dict[str, Callable] = {}


def register_preference_loss(name: str) -> Callable[[F_], F_]:
    """Register ``fn(chosen_logratio (P,), rejected_logratio (P,), *, beta) -> (losses, metrics)``."""
    return _register(_PREFERENCE_LOSSES, "preference loss", name)


def get_preference_loss(name: str) -> Callable:
    return _get(_PREFERENCE_LOSSES, "preference loss", name)


def preference_loss_names() -> list[str]:
    return sorted(_PREFERENCE_LOSSES)


def _pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor, beta: float) -> dict[str, float]:
    with torch.no_grad():
        margin = chosen - rejected
        return {
            "reward_accuracy": float((margin > 0).float().mean()),
            "reward_margin": float(beta * margin.mean()),
            "reward_chosen": float(beta * chosen.mean()),
            "reward_rejected": float(beta * rejected.mean()),
        }


@register_preference_loss("sigmoid")
def dpo_sigmoid(
    chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, *, beta: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO: losses (P,) = -log sigmoid(beta * (chosen_logratio - rejected_logratio))."""
    margin = chosen_logratio - rejected_logratio  # (P,)
    return -F.logsigmoid(beta * margin), _pair_metrics(chosen_logratio, rejected_logratio, beta)


@register_preference_loss("ipo")
def ipo(
    chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, *, beta: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """IPO: losses (P,) = (chosen_logratio - rejected_logratio - 1 / (2 beta))^2."""
    margin = chosen_logratio - rejected_logratio  # (P,)
    losses = (margin - 1.0 / (2.0 * beta)) ** 2
    return losses, _pair_metrics(chosen_logratio, rejected_logratio, beta)


def sequence_logratio(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(N, T) token log-probs of the policy and the reference -> (N,) summed log-ratio of
    each row's loss tokens (padding and prompt positions are ignored, whatever they hold)."""
    return torch.where(mask, logprobs - ref_logprobs, 0.0).sum(-1)


@dataclass(frozen=True)
class DPOLoss(LossFn):
    """loss_fn(outputs, batch) -> (loss, metrics) for ``TrainEngine.train_batch``.

    The batch interleaves pairs: row 2k is pair k's chosen completion, row 2k+1 its
    rejected one (``item_index`` is the pair's index on both), and ``batch.ref_logprobs``
    holds the reference's token log-probs. The loss is the mean over pairs, so the
    engine's micro-batch weight is the number of pairs; a micro-batch must hold whole
    pairs (an even ``train.micro_batch_sequences``). A dataclass, so it pickles.
    """

    loss: str = "sigmoid"
    beta: float = 0.1

    def __post_init__(self) -> None:
        get_preference_loss(self.loss)  # an unknown name fails here, not mid-stage
        if self.beta <= 0:
            raise ValueError(f"DPO beta must be positive, got {self.beta}")

    def loss_weight(self, batch: Batch) -> int:
        """Pairs in ``batch``: what the loss averages over."""
        return batch.size // 2

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Batch
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if batch.ref_logprobs is None:
            raise ValueError("DPOLoss needs batch.ref_logprobs (the reference's log-probs)")
        index = batch.item_index
        if batch.size % 2 or not torch.equal(index[0::2], index[1::2]):
            raise ValueError(
                "a DPO micro-batch must hold whole (chosen, rejected) pairs in adjacent rows: "
                "use an even train.micro_batch_sequences"
            )
        ratio = sequence_logratio(outputs["logprobs"], batch.ref_logprobs, batch.loss_mask)
        losses, metrics = get_preference_loss(self.loss)(ratio[0::2], ratio[1::2], beta=self.beta)
        loss = losses.mean()
        metrics["dpo_loss"] = loss.item()
        return loss, metrics

"""``LossFn``: what a trainer's ``train_batch(batch, loss_fn)`` calls, with its defaults.

A loss is ``loss_fn(outputs, batch) -> (loss, metrics)``, ``outputs`` the trainer's
forward of a (micro-)batch: ``{"logprobs", "entropy"}`` and, when the loss asks,
``"values"``. Every loss inherits this protocol and overrides only what differs from
its defaults; the trainers read these members and probe for nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class LossFn(Protocol):
    needs_entropy: bool = False
    """Keep the entropy's autograd graph (it is passed, detached, for metrics anyway)."""

    needs_values: bool = False
    """The language-model trainer runs its value head and passes ``outputs["values"]``."""

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Any
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The loss of one (micro-)batch, and its metrics."""
        ...

    def loss_weight(self, batch: Any) -> int:
        """How many units (tokens, sequences) the loss averages over: the weight of a
        micro-batch's loss in its minibatch. Default: the loss-mask tokens."""
        return int(batch.loss_mask.sum())

    def after_step(self) -> None:
        """Called after each optimizer step (target networks, delayed-update counters)."""

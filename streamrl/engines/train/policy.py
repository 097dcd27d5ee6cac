"""PolicyTrainEngine: trains an environment policy with ``train_batch(batch, loss_fn)``.

The same contract as the language-model :class:`~streamrl.engines.train.engine.TrainEngine`:
the algorithm passes its loss in. A batch is flat transitions
(:class:`TransitionBatch`); ``train_batch`` runs ``epochs`` passes, each over the batch
shuffled into ``num_minibatches`` minibatches (one optimizer step each), as PPO does.
The shuffling generator is seeded per call from the engine's step count, so a run is
reproducible and a resumed run shuffles as the uninterrupted one would.

Any batch with ``size``, ``rows(index)``, ``obs`` and ``actions`` trains the same way
(TD algorithms pass :class:`~streamrl.core.transitions.Transitions`). The loss is a
:class:`~streamrl.core.loss.LossFn`; its ``after_step()`` runs after each optimizer
step (Polyak averaging of target networks, delayed actor updates).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from streamrl.core.loss import LossFn
from streamrl.engines.train.optim import Optimized


@dataclass
class TransitionBatch:
    """M transitions (the steps of the batch's segments, flattened).

    obs (M, *obs_shape); actions (M, ...); logprobs, values, advantages, returns (M,).
    ``logprobs`` and ``values`` are the behaviour policy's; ``advantages`` and
    ``returns`` (the critic's targets) come from the algorithm's ``prepare``. Decoupled
    PPO replaces ``logprobs`` by the proximal policy's and sets ``weights`` (M,), the
    corrected pi_prox / pi_behave of each transition.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])

    def rows(self, index: torch.Tensor) -> TransitionBatch:
        fields = (getattr(self, f.name) for f in dataclasses.fields(self))
        return TransitionBatch(*(None if x is None else x[index] for x in fields))


class PolicyTrainEngine(Optimized):
    """A :class:`~streamrl.models.policies.Policy` and its AdamW."""

    def __init__(self, policy: torch.nn.Module, *, seed: int = 0, **kwargs: Any) -> None:
        # Adam as SB3 and CleanRL set it for PPO (fused, like every Optimized)
        kwargs.setdefault("betas", (0.9, 0.999))
        kwargs.setdefault("eps", 1e-5)
        super().__init__(policy, **kwargs)
        self.seed = seed

    def ensure_value_head(self) -> None:
        """Nothing to add: the policy network has its own critic."""

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """``clip_grad_norm_``'s arithmetic in four ops (its device grouping and checks
        cost more than a small policy's norms)."""
        grads = [p.grad for p in self.trainable if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm

    def forward(self, batch: TransitionBatch) -> dict[str, torch.Tensor]:
        """logprobs, entropy, values (M,) of the batch's actions under the current policy."""
        return self.model(batch.obs.to(self.device), batch.actions.to(self.device))

    @torch.no_grad()
    def evaluate(self, batch: TransitionBatch) -> dict[str, torch.Tensor]:
        """:meth:`forward` without gradients (V-trace's target log-probs and values)."""
        return {k: v.cpu() for k, v in self.forward(batch).items()}

    @torch.no_grad()
    def evaluate_values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) (B,) under the current weights."""
        policy = self.model
        return policy.critic(policy.trunk(policy.normalize(obs.to(self.device)))).squeeze(-1).cpu()

    def train_batch(
        self,
        batch: Any,
        loss_fn: LossFn,
        *,
        num_minibatches: int = 1,
        epochs: int = 1,
    ) -> dict[str, float]:
        if not 1 <= num_minibatches <= batch.size:
            raise ValueError(f"num_minibatches must be in [1, {batch.size}], got {num_minibatches}")
        self.model.train()
        lr = float(self.optimizer.param_groups[0]["lr"])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.global_step)
        sums: dict[str, float] = defaultdict(float)
        steps = skipped = 0
        batch = _to(batch, self.device)
        for _ in range(epochs):
            if num_minibatches == 1:  # the whole batch: its order does not change the loss
                minibatches = [batch]
            else:
                perm = torch.randperm(batch.size, generator=g).to(self.device)
                minibatches = [batch.rows(index) for index in perm.tensor_split(num_minibatches)]
            for mini in minibatches:
                for p in self.trainable:  # zero_grad(set_to_none=True), minus its overhead
                    p.grad = None
                loss, metrics = loss_fn(self.forward(mini), mini)
                loss.backward()
                grad_norm = self.step_optimizer()
                if grad_norm is None:
                    skipped += 1
                    continue
                steps += 1
                loss_fn.after_step()  # target networks, delayed-update counters
                sums["loss"] += float(loss.detach())
                sums["grad_norm"] += grad_norm
                for k, v in metrics.items():
                    sums[k] += float(v)
        out = {k: v / steps for k, v in sums.items()} if steps else {}
        out.update(lr=lr, steps=float(steps), skipped_steps=float(skipped))
        return out

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def save(self, path: str | Path, tokenizer: Any = None) -> None:
        self.model.save_pretrained(path, self.state_dict_for_inference())


def _to(batch: Any, device: torch.device) -> Any:
    """The batch (a TransitionBatch, or any dataclass of tensors) with its tensors on
    ``device``."""
    moved = {
        f.name: value.to(device)
        for f in dataclasses.fields(batch)
        if isinstance(value := getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **moved)

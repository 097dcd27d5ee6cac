"""Outcome-reward policy gradient: GRPO, Dr. GRPO, RLOO, REINFORCE++ and friends.

One scalar advantage per trajectory, from the rewards of its group (a registered
pure function, ``algorithm.advantage``), is given to every generated token, and a
registered policy loss (``algorithm.policy_loss``: PPO-clip, GSPO, CISPO) is
minimised, optionally with a KL penalty to a frozen copy of the starting policy
and an entropy bonus. With ``algorithm.decoupled`` the loss clips against the
proximal policy (AReaL's decoupled PPO), which corrects for stale samples.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.algorithms.advantages import broadcast_to_tokens
from streamrl.algorithms.base import (
    DEFAULT,
    EQUAL_REWARDS,
    Algorithm,
    Filtered,
    Timer,
    register_algorithm,
)
from streamrl.algorithms.losses import PolicyLossParams, RLLoss
from streamrl.algorithms.registry import advantage_names, get_advantage
from streamrl.core.types import WEIGHT_KEY, Batch, Trajectory


def zero_variance(trajectories: list[Trajectory]) -> bool:
    """Dynamic sampling (DAPO): a group whose rewards are all equal has no signal."""
    rewards = [t.reward for t in trajectories]
    return len(rewards) > 1 and max(rewards) == min(rewards)


def sample_weights(trajectories: list[Trajectory]) -> torch.Tensor:
    """(N,) each sample's weight (``WEIGHT_KEY`` in its metadata, 1 where absent),
    normalised to mean 1 over the batch (self-normalised importance sampling: the step
    size stays that of an unweighted batch)."""
    w = torch.tensor([float(t.metadata.get(WEIGHT_KEY, 1.0)) for t in trajectories])
    return w / w.mean()


@register_algorithm(DEFAULT)
class PolicyGradient(Algorithm):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        a = cfg.algorithm
        # an Algorithm registered under its own name may compute advantages itself
        self.advantage_fn = get_advantage(a.advantage) if a.advantage in advantage_names() else None
        if getattr(self.advantage_fn, "group_relative", False) and cfg.rollout.group_size < 2:
            raise ValueError(
                f"algorithm.advantage={a.advantage} compares the samples of one prompt with "
                f"each other, so rollout.group_size={cfg.rollout.group_size} gives every sample "
                "an advantage of 0 and nothing is learned; use rollout.group_size >= 2"
            )
        # The proximal policy is the weights before this step's update. With one
        # optimizer step per batch they are the weights of the training forward itself
        # (the loss detaches them: no extra pass); with several, a separate forward
        # must freeze them before the first step.
        steps = cfg.train.num_minibatches * cfg.train.epochs  # optimizer steps per batch
        self.proximal_forward = a.decoupled and steps > 1
        self._loss = RLLoss(
            a.policy_loss,
            PolicyLossParams(
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                agg_mode=a.agg_mode,
                max_tokens=cfg.rollout.max_new_tokens,
                behave_imp_weight_cap=a.behave_imp_weight_cap,
                is_correction=a.is_correction,
                is_cap=a.is_cap,
                icepop_band=tuple(a.icepop_band),
            ),
            kl_coef=a.kl_coef,
            kl_kind=a.kl_kind,
            entropy_coef=a.entropy_coef,
            proximal_from_current=a.decoupled and not self.proximal_forward,
        )
        self.reference: Any = None
        self.pad_id = 0

    @property
    def loss_fn(self) -> RLLoss:
        return self._loss

    def finish_group(
        self, samples: list[Trajectory], extras: dict[str, Trajectory]
    ) -> list[Trajectory] | Filtered:
        if self.cfg.algorithm.dynamic_sampling and zero_variance(samples):
            return Filtered(EQUAL_REWARDS)
        return samples

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else 0
        if self.cfg.algorithm.kl_coef > 0:  # KL to the policy RL starts from
            self.reference = trainer.frozen_copy()

    def advantages(self, batch: Batch, trajectories: list[Trajectory]) -> Any:
        """(N,) sequence advantages; subclasses with more inputs override this."""
        return self.advantage_fn(batch.rewards, batch.item_index)

    def signal(
        self, batch: Batch, trajectories: list[Trajectory], trainer: Any, timer: Timer
    ) -> None:
        """Fills ``batch.advantages`` (N, T): here the group's advantage of each sample
        on every generated token; an algorithm with a per-token signal overrides this."""
        with timer("advantage"):
            adv = self.advantages(batch, trajectories) * sample_weights(trajectories)
            batch.advantages = broadcast_to_tokens(adv, batch.loss_mask)  # (N, T)

    def prepare(self, groups: list, trainer: Any, timer: Timer) -> Batch:
        trajectories = [t for g in groups for t in g.trajectories]
        batch = Batch.collate(trajectories, pad_id=self.pad_id)
        self.signal(batch, trajectories, trainer, timer)
        if self.reference is not None:
            with timer("ref_logprob"):
                batch.ref_logprobs = trainer.compute_logprobs(batch, model=self.reference)
        if self.proximal_forward:
            with timer("logprob"):
                batch.proximal_logprobs = trainer.compute_logprobs(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        return {"reference": {k: v.detach().cpu() for k, v in self.reference.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "reference" in state:
            if self.reference is None:
                raise ValueError("checkpoint has a reference model but algorithm.kl_coef is 0")
            self.reference.load_state_dict(state["reference"])

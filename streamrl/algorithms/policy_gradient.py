"""Outcome-reward policy gradient: GRPO, Dr. GRPO, RLOO, REINFORCE++ and friends.

One scalar advantage per trajectory, from the rewards of its group (a registered
pure function, named by ``algorithm.name``), is given to every generated token, and a
registered policy loss (``algorithm.policy_loss``: PPO-clip, GSPO, CISPO) is
minimised, optionally with a KL penalty to a frozen copy of the starting policy
(``algorithm.kl.*``) and an entropy bonus. With ``algorithm.decoupled`` the loss clips against the
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
    pad_id,
    register_algorithm,
)
from streamrl.algorithms.losses import PolicyLossParams, RLLoss
from streamrl.algorithms.registry import AdvantageFn, advantage_names, get_advantage
from streamrl.config import AlgorithmConfig, CorrectionConfig, RunContext
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


def check_group_size(name: str, group_size: int) -> None:
    """A group-relative estimator needs two samples per item to compare."""
    if group_size < 2:
        raise ValueError(
            f"algorithm.name={name} compares the samples of one prompt with each other, so "
            f"rollout.group_size={group_size} gives every sample an advantage of 0 and "
            "nothing is learned; use rollout.group_size >= 2"
        )


def correction_params(c: CorrectionConfig) -> dict[str, Any]:
    """``PolicyLossParams``' fields of the decoupled weight's correction."""
    return {
        "behave_imp_weight_cap": c.behave_imp_weight_cap,
        "is_correction": c.kind,
        "is_cap": c.cap,
        "icepop_band": (c.icepop_band[0], c.icepop_band[1]),
    }


def policy_loss_params(cfg: AlgorithmConfig, *, max_tokens: int | None) -> PolicyLossParams:
    """The policy loss's hyper-parameters from the section (``max_tokens``: the
    generation budget, Dr. GRPO's constant divisor)."""
    return PolicyLossParams(
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        agg_mode=cfg.agg_mode,
        max_tokens=max_tokens,
        **correction_params(cfg.correction),
    )


@register_algorithm(DEFAULT)
class PolicyGradient(Algorithm):
    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        # an Algorithm registered under its own name may compute advantages itself
        self.advantage_fn: AdvantageFn | None = (
            get_advantage(cfg.name) if cfg.name in advantage_names() else None
        )
        if self.advantage_fn is not None and self.advantage_fn.group_relative:
            check_group_size(cfg.name, run.group_size)
        # The proximal policy is the weights before this step's update. With one
        # optimizer step per batch they are the weights of the training forward itself
        # (the loss detaches them: no extra pass); with several, a separate forward
        # must freeze them before the first step.
        self.proximal_forward = cfg.decoupled and run.updates_per_batch > 1
        self._loss = RLLoss(
            cfg.policy_loss,
            policy_loss_params(cfg, max_tokens=run.max_new_tokens),
            kl_coef=cfg.kl.coef,
            kl_kind=cfg.kl.kind,
            entropy_coef=cfg.entropy_coef,
            proximal_from_current=cfg.decoupled and not self.proximal_forward,
        )
        self.reference: Any = None
        self.pad_id = 0

    @property
    def loss_fn(self) -> RLLoss:
        return self._loss

    def finish_group(
        self, samples: list[Trajectory], extras: dict[str, Trajectory]
    ) -> list[Trajectory] | Filtered:
        if self.cfg.dynamic_sampling and zero_variance(samples):
            return Filtered(EQUAL_REWARDS)
        return samples

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        self.pad_id = pad_id(tokenizer)
        if self.cfg.kl.coef > 0:  # KL to the policy RL starts from
            self.reference = trainer.frozen_copy()

    def advantages(self, batch: Batch, trajectories: list[Trajectory]) -> Any:
        """(N,) sequence advantages; subclasses with more inputs override this."""
        return self.advantage_fn(batch.rewards, batch.item_index)

    def token_advantages(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor:
        """(N, T) advantages of the generated tokens: the sequence advantage, weighted,
        on every one; an estimator with per-turn credit overrides this."""
        adv = self.advantages(batch, trajectories) * sample_weights(trajectories)
        return broadcast_to_tokens(adv, batch.loss_mask)

    def signal(
        self, batch: Batch, trajectories: list[Trajectory], trainer: Any, timer: Timer
    ) -> None:
        """Fills ``batch.advantages`` (N, T) from :meth:`token_advantages`; an algorithm
        whose per-token signal needs the trainer (a teacher's forward) overrides this."""
        with timer("advantage"):
            batch.advantages = self.token_advantages(batch, trajectories)

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
                raise ValueError("checkpoint has a reference model but algorithm.kl.coef is 0")
            self.reference.load_state_dict(state["reference"])

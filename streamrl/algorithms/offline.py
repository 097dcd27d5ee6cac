"""Offline and offline-to-online RL on transitions: ``algorithm.name: bc | iql | td3_bc``.

Each is an :class:`~streamrl.algorithms.base.Algorithm`; the controller runs them as it
runs PPO. ``prepare`` turns the batch's groups into one
:class:`~streamrl.core.transitions.Transitions` (logged items as they are, online
segments through :func:`~streamrl.core.transitions.segment_transitions`), and the policy
trainer runs ``train.num_minibatches`` optimizer steps on it with the algorithm's loss.

- ``bc``: behaviour cloning, the negative log-likelihood of the logged actions.
- ``iql`` (Kostrikov et al. 2021): the policy's critic is V(s), trained to an upper
  expectile of the target twin Q(s, a); the twin Q regresses on r + gamma V(s'); the
  policy is extracted by advantage-weighted regression, weights exp(beta (Q - V))
  capped. Discrete actions (Q(s, .) heads) and continuous ones (Q(s, a)). Rewards enter
  the TD target times ``algorithm.offline.reward_scale`` (IQL's reward normalisation: beta reads
  advantages in those units); ``awr_ess`` reports how concentrated the weights are.
- ``td3_bc`` (Fujimoto & Gu 2021), continuous actions: the Gaussian policy's mean is
  the deterministic actor (its fixed log-std is the exploration noise when it plays
  online); twin critics against the clipped double-Q target with target policy
  smoothing; the actor maximises alpha Q / mean|Q| minus the BC error, once every
  ``policy_delay`` critic updates, and the targets follow by Polyak averaging then.

All terms are summed into one loss over one AdamW (the networks share no parameter;
the actor's Q term reads the critic through detached parameters, so it trains the
actor only). The Q-networks are extra trainables of the policy trainer (checkpointed
with it); the target networks are this object's state (``state_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import functional_call

from streamrl.algorithms.base import Algorithm, Filtered, Timer, register_algorithm
from streamrl.algorithms.offline_losses import (
    awr_loss,
    awr_weight_stats,
    bc_loss,
    expectile_loss,
    iql_q_loss,
    smoothed_actions,
    td3_bc_actor_loss,
    td3_critic_loss,
    td3_target,
)
from streamrl.config import AlgorithmConfig, RunContext
from streamrl.core.loss import LossFn
from streamrl.core.sample import Sample
from streamrl.core.transitions import Transitions, concat
from streamrl.engines.train.policy import PolicyTrainEngine
from streamrl.models.q_networks import TwinQ, frozen_copy, polyak_update


def batch_transitions(groups: list[Any]) -> Transitions:
    """The groups' samples as one Transitions, in order (logged ones as they are,
    environment segments turned into their transitions)."""
    return concat([t.transitions() for g in groups for t in g.trajectories])


def _value(policy: Any, obs_n: torch.Tensor) -> torch.Tensor:
    """V(s) (M,) from the policy's critic, on normalised observations."""
    return policy.critic(policy.trunk(obs_n)).squeeze(-1)


def _mean_action(policy: Any, obs_n: torch.Tensor) -> torch.Tensor:
    """The Gaussian policy's mean (M, A): its deterministic action."""
    return policy.actor(policy.trunk(obs_n))


@dataclass
class BCLoss(LossFn):
    def __call__(self, outputs: dict[str, torch.Tensor], batch: Transitions) -> tuple:
        loss = bc_loss(outputs["logprobs"])
        return loss, {"bc_nll": float(loss.detach())}


@dataclass(eq=False)
class IQLLoss(LossFn):
    policy: Any
    q: TwinQ
    target_q: TwinQ
    gamma: float
    expectile: float
    beta: float
    max_weight: float
    tau: float
    reward_scale: float = 1.0

    def __call__(self, outputs: dict[str, torch.Tensor], batch: Transitions) -> tuple:
        obs_n = self.policy.normalize(batch.obs)
        with torch.no_grad():
            tq = torch.minimum(*self.target_q(obs_n, batch.actions))
            next_v = _value(self.policy, self.policy.normalize(batch.next_obs))
        v = outputs["values"]
        value_loss = expectile_loss(tq, v, self.expectile)
        q1, q2 = self.q(obs_n, batch.actions)
        q_loss = iql_q_loss(
            q1, q2, batch.rewards * self.reward_scale, next_v, batch.terminated, gamma=self.gamma
        )
        adv = tq - v.detach()
        policy_loss = awr_loss(outputs["logprobs"], adv, beta=self.beta, max_weight=self.max_weight)
        with torch.no_grad():
            metrics = {
                "value_loss": float(value_loss),
                "q_loss": float(q_loss),
                "policy_loss": float(policy_loss),
                "q_mean": float(q1.mean()),
                "v_mean": float(v.mean()),
                "advantage_mean": float(adv.mean()),
                "bc_nll": float(-outputs["logprobs"].mean()),
                **awr_weight_stats(adv, beta=self.beta, max_weight=self.max_weight),
            }
        return value_loss + q_loss + policy_loss, metrics

    def after_step(self) -> None:
        polyak_update(self.target_q, self.q, self.tau)


@dataclass(eq=False)
class TD3BCLoss(LossFn):
    policy: Any
    q: TwinQ
    target_q: TwinQ
    target_actor: torch.nn.Module
    low: torch.Tensor
    high: torch.Tensor
    gamma: float
    alpha: float
    noise: float
    noise_clip: float
    delay: int
    tau: float
    generator: torch.Generator = field(default_factory=torch.Generator)
    updates: int = 0  # critic updates so far

    @property
    def actor_step(self) -> bool:
        return (self.updates + 1) % self.delay == 0

    def __call__(self, outputs: dict[str, torch.Tensor], batch: Transitions) -> tuple:
        obs_n, next_n = self.policy.normalize(batch.obs), self.policy.normalize(batch.next_obs)
        with torch.no_grad():
            next_a = smoothed_actions(
                self.target_actor(next_n),
                self.low,
                self.high,
                noise=self.noise,
                noise_clip=self.noise_clip,
                generator=self.generator,
            )
            y = td3_target(
                batch.rewards, batch.terminated, *self.target_q(next_n, next_a), gamma=self.gamma
            )
        q1, q2 = self.q(obs_n, batch.actions)
        loss = critic_loss = td3_critic_loss(q1, q2, y)
        metrics = {"q_loss": float(critic_loss.detach()), "q_mean": float(q1.detach().mean())}
        if self.actor_step:
            mean = _mean_action(self.policy, obs_n)
            pi = torch.maximum(torch.minimum(mean, self.high), self.low)  # what the env plays
            frozen = {k: v.detach() for k, v in self.q.q1.named_parameters()}
            q_pi = functional_call(self.q.q1, frozen, (obs_n, pi))
            actor_loss = td3_bc_actor_loss(q_pi, mean, batch.actions, alpha=self.alpha)
            loss = loss + actor_loss
            metrics["actor_loss"] = float(actor_loss.detach())
            metrics["bc_mse"] = float((mean - batch.actions).square().mean().detach())
        return loss, metrics

    def after_step(self) -> None:
        if self.actor_step:
            polyak_update(self.target_q, self.q, self.tau)
            polyak_update(self.target_actor, self.policy.actor, self.tau)
        self.updates += 1


class TransitionAlgorithm(Algorithm):
    """What bc, iql and td3_bc share: one sample per item, transitions in, metrics of
    the logged/online mix out."""

    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        if run.group_size != 1:
            raise ValueError(
                f"algorithm.name={cfg.name} trains on transitions: rollout.group_size must "
                f"be 1, got {run.group_size}"
            )
        if run.episode != "gym":
            raise ValueError(
                f"algorithm.name={cfg.name} needs rollout.episode=gym (logged items and "
                f"environment segments), got {run.episode!r}"
            )
        self._loss: Any = None

    @property
    def loss_fn(self) -> Any:
        return self._loss

    def finish_group(
        self, samples: list[Sample], extras: dict[str, Sample]
    ) -> list[Sample] | Filtered:
        return samples

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        if not isinstance(trainer, PolicyTrainEngine):
            raise ValueError(
                f"algorithm.name={self.cfg.name} trains an environment policy "
                "(model.name_or_path: mlp or a saved policy), not a language model"
            )

    def prepare(self, groups: list, trainer: Any, timer: Timer) -> Transitions:
        with timer("advantage"):
            data = batch_transitions(groups)
            trainer.model.update_obs_stats(data.obs)
        return data


@register_algorithm("bc")
class BehaviorCloning(TransitionAlgorithm):
    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        self._loss = BCLoss()


class _QAlgorithm(TransitionAlgorithm):
    """Builds a twin Q (trained with the policy) and its target copy (this object's)."""

    def _twin_q(self, trainer: Any) -> tuple[TwinQ, TwinQ]:
        policy = trainer.model
        if policy.config["arch"] != "mlp":
            raise ValueError(
                f"algorithm.name={self.cfg.name} has MLP Q-networks: it needs vector "
                "observations and an mlp policy (model.name_or_path: mlp)"
            )
        obs_dim = policy.obs_shape[0]
        with torch.random.fork_rng(devices=[]):  # the init is the seed's, whatever ran before
            torch.manual_seed(self.run.seed + 17)
            q = TwinQ(obs_dim, policy.act_dim, policy.discrete, list(self.cfg.offline.q_hidden))
        trainer.add_trainable(q)
        return q, frozen_copy(q).to(trainer.device)

    def state_dict(self) -> dict[str, Any]:
        if self._loss is None:  # before setup
            return {}
        return {"target_q": self._loss.target_q.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loss.target_q.load_state_dict(state["target_q"])


@register_algorithm("iql")
class IQL(_QAlgorithm):
    def setup(self, trainer: Any, tokenizer: Any) -> None:
        super().setup(trainer, tokenizer)
        o = self.cfg.offline
        q, target_q = self._twin_q(trainer)
        self._loss = IQLLoss(
            trainer.model,
            q,
            target_q,
            gamma=o.gamma,
            expectile=o.expectile,
            beta=o.awr_beta,
            max_weight=o.awr_max_weight,
            tau=o.target_tau,
            reward_scale=o.reward_scale,
        )


@register_algorithm("td3_bc")
class TD3BC(_QAlgorithm):
    def setup(self, trainer: Any, tokenizer: Any) -> None:
        super().setup(trainer, tokenizer)
        policy, o = trainer.model, self.cfg.offline
        if policy.discrete:
            raise ValueError(
                "algorithm.name=td3_bc needs continuous (Box) actions; for Discrete "
                "actions use iql or bc"
            )
        q, target_q = self._twin_q(trainer)
        box = policy.config["action"]
        bound = lambda k: torch.tensor(box[k], dtype=torch.float32).reshape(-1)  # noqa: E731
        self._loss = TD3BCLoss(
            policy,
            q,
            target_q,
            frozen_copy(policy.actor),
            bound("low").to(trainer.device),
            bound("high").to(trainer.device),
            gamma=o.gamma,
            alpha=o.td3_alpha,
            noise=o.policy_noise,
            noise_clip=o.noise_clip,
            delay=o.policy_delay,
            tau=o.target_tau,
            generator=torch.Generator().manual_seed(self.run.seed),
        )

    def state_dict(self) -> dict[str, Any]:
        loss = self._loss
        if loss is None:
            return {}
        return {
            **super().state_dict(),
            "target_actor": loss.target_actor.state_dict(),
            "updates": loss.updates,
            "generator": loss.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._loss.target_actor.load_state_dict(state["target_actor"])
        self._loss.updates = state["updates"]
        self._loss.generator.set_state(state["generator"])

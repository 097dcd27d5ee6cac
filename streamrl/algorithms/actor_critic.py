"""PPO with a learned critic: ``algorithm.name: ppo`` (GAE) or ``appo`` (V-trace).

One algorithm for two kinds of experience:

- **environment segments** (:class:`~streamrl.core.types.Segment`, Gymnasium): the policy
  network's critic gave each step's value when the segment was played. ``ppo`` uses
  those values with correct bootstrapping (a truncated episode is bootstrapped from
  V(final observation), a terminated one is not). ``appo`` (IMPALA/APPO) recomputes
  the values and log-probs under the current weights before the update and corrects
  for the behaviour policy being stale (eta >= 1) with V-trace's truncated importance
  weights (``algorithm.vtrace.*``).
- **language-model trajectories**: token-level PPO as in the original RLHF recipe. A
  value head on the LM's last hidden state (zero-initialised, trained with the LM)
  scores every state; the outcome reward is given at the last generated token, GAE runs
  over the generated tokens only (observation tokens of an agent episode are skipped:
  the value after them is the next generated token's).

The loss (:class:`ActorCriticLoss`, a pure function of tensors) is PPO's clipped
surrogate, plus ``vf_coef`` times the (optionally clipped) value error, minus
``entropy_coef`` times the entropy, with advantages normalised per minibatch
(``algorithm.ppo.*``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from streamrl.algorithms.base import (
    Algorithm,
    Filtered,
    Timer,
    pad_id,
    register_algorithm,
)
from streamrl.algorithms.losses import PolicyLossParams, decoupled_old_policy
from streamrl.algorithms.policy_gradient import correction_params
from streamrl.algorithms.returns import gae, next_values, vtrace
from streamrl.config import AlgorithmConfig, RunContext
from streamrl.core.loss import LossFn
from streamrl.core.sample import Sample
from streamrl.core.types import Batch, Segment, Trajectory

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _dense_reductions() -> tuple[Reduce, Reduce, Reduce]:
    """(mean, population variance, normalise) over every element: the fused ATen
    reductions (every op counts on a tiny network's step)."""

    def normalize(x: torch.Tensor) -> torch.Tensor:  # unbiased std, as SB3 and CleanRL
        if x.numel() < 2:
            return x - x.mean()
        std, mu = torch.std_mean(x)
        return (x - mu) / (std + 1e-8)

    return torch.mean, lambda x: torch.var(x, correction=0), normalize


def _masked_reductions(mask: torch.Tensor) -> tuple[Reduce, Reduce, Reduce]:
    """(mean, population variance, normalise) over the elements where ``mask`` holds."""
    n = mask.sum().clamp(min=1)

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, 0.0).sum() / n

    def var(x: torch.Tensor) -> torch.Tensor:
        return mean((x - mean(x)) ** 2)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        std = (var(x) * n / (n - 1).clamp(min=1)).sqrt()
        return (x - mean(x)) / (std + 1e-8)

    return mean, var, normalize


def _value_error(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, vf_clip: float | None
) -> torch.Tensor:
    """max((V - R)^2, (V_old + clip(V - V_old, +-vf_clip) - R)^2); unclipped without vf_clip."""
    err = (values - returns) ** 2
    if vf_clip is not None:
        clipped = old_values + (values - old_values).clamp(-vf_clip, vf_clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return err


def actor_critic_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    clip: float,
    vf_coef: float,
    vf_clip: float | None,
    entropy_coef: float,
    norm_advantages: bool,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """All tensors the same shape ((M,) transitions or (N, T) tokens); ``mask`` bool, or
    None when every element counts (transitions: fewer ops on a tiny network's step).

    ratio = exp(logprobs - old_logprobs)
    policy = mean(w max(-A ratio, -A clip(ratio, 1 - clip, 1 + clip)))
    value  = mean(0.5 max((V - R)^2, (V_old + clip(V - V_old, +-vf_clip) - R)^2))
    loss   = policy + vf_coef value - entropy_coef mean(entropy)

    Decoupled PPO (Hilton et al. 2021; AReaL): ``old_logprobs`` are the proximal
    policy's (the weights before this update) and ``weights`` w the detached, corrected
    pi_prox / pi_behave; ``weights=None`` (w = 1) is standard PPO.
    """
    mean, var, normalize = _dense_reductions() if mask is None else _masked_reductions(mask)
    adv = normalize(advantages) if norm_advantages else advantages
    log_ratio = logprobs - old_logprobs
    if mask is not None:
        log_ratio = torch.where(mask, log_ratio, 0.0)
    log_ratio = log_ratio.clamp(-20, 20)
    ratio = log_ratio.exp()
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    policy = mean(surrogate if weights is None else weights * surrogate)
    value = 0.5 * mean(_value_error(values, old_values, returns, vf_clip))
    loss = policy + vf_coef * value
    if entropy_coef:  # else the entropy stays out of the graph: no backward through it
        ent = mean(entropy)
        loss = loss - entropy_coef * ent
    with torch.no_grad():
        excess = ratio - 1
        metrics = {
            "policy_loss": float(policy),
            "value_loss": float(value),
            "entropy": float(mean(entropy)),
            "approx_kl": float(mean(excess - log_ratio)),
            "clip_frac": float(mean((excess.abs() > clip).float())),
            "explained_variance": float(
                1 - var(returns - old_values) / var(returns).clamp(min=1e-8)
            ),
        }
    return loss, metrics


@dataclass(frozen=True)
class ActorCriticLoss(LossFn):
    """``loss_fn(outputs, batch)`` on transitions (a
    :class:`~streamrl.engines.train.policy.TransitionBatch`: (M,) each, every element
    counts, ``weights`` set by decoupled PPO). A dataclass: it pickles."""

    clip: float
    vf_coef: float
    vf_clip: float | None
    entropy_coef: float
    norm_advantages: bool
    needs_values: bool = True  # the LM engine computes the value head's values
    needs_entropy: bool = True

    def loss_weight(self, batch: Any) -> int:
        return batch.size

    def old_policy(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(old log-probs, old values, mask, decoupled weights) of the batch."""
        return batch.logprobs, batch.values, None, batch.weights

    def __call__(self, outputs: dict[str, torch.Tensor], batch: Any) -> tuple[torch.Tensor, dict]:
        old_lp, old_v, mask, weights = self.old_policy(batch)
        return actor_critic_loss(
            outputs["logprobs"],
            old_lp,
            batch.advantages,
            outputs["values"],
            old_v,
            batch.returns,
            outputs["entropy"],
            mask,
            clip=self.clip,
            vf_coef=self.vf_coef,
            vf_clip=self.vf_clip,
            entropy_coef=self.entropy_coef,
            norm_advantages=self.norm_advantages,
            weights=weights,
        )


@dataclass(frozen=True)
class TokenActorCriticLoss(ActorCriticLoss):
    """The same loss on a language model's tokens: a :class:`~streamrl.core.types.Batch`,
    (N, T) with its loss mask, averaged over the loss tokens."""

    def loss_weight(self, batch: Any) -> int:
        return int(batch.loss_mask.sum())

    def old_policy(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return batch.behavior_logprobs, batch.values, batch.loss_mask, None


#: the per-step (T, N, ...) tensors of a segment, joined along the environments
STEP_FIELDS = (
    "obs",
    "actions",
    "logprobs",
    "values",
    "rewards",
    "terminated",
    "truncated",
    "final_values",
)


def stack_segments(segments: list[Segment]) -> dict[str, torch.Tensor]:
    """Concatenate segments along their environments: (T, sum N_i, ...)."""
    out = {f: torch.cat([getattr(s, f) for s in segments], dim=1) for f in STEP_FIELDS}
    out["last_obs"] = torch.cat([s.last_obs for s in segments], dim=0)
    out["last_values"] = torch.cat([s.last_values for s in segments], dim=0)
    # (T, sum N_i): the weight version of every step of every environment
    out["versions"] = torch.cat(
        [s.versions[:, None].expand(-1, s.rewards.shape[1]) for s in segments], 1
    )
    return out


class ActorCritic(Algorithm):
    """PPO with a critic; ``vtrace``: V-trace's targets and advantages (``appo``)."""

    vtrace: ClassVar[bool] = False

    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        self.clip = cfg.clip_low  # annealed with algorithm.ppo.clip_schedule=linear
        self._loss = self._make_loss(ActorCriticLoss)
        self.total_steps = max(1, run.total_updates)
        self.pad_id = 0
        # decoupled PPO on stale segments (ppo only: V-trace corrects them its own way)
        self.decoupled = cfg.decoupled and not self.vtrace and run.max_staleness > 0
        self._params = PolicyLossParams(**correction_params(cfg.correction))
        self.version = 0  # the trainer's weight version: one per prepared batch

    def _make_loss(self, kind: type[ActorCriticLoss]) -> ActorCriticLoss:
        p = self.cfg.ppo
        return kind(
            clip=self.clip,
            vf_coef=p.vf_coef,
            vf_clip=p.vf_clip,
            entropy_coef=self.cfg.entropy_coef,
            norm_advantages=p.norm_advantages,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state.get("version", self.version))

    @property
    def loss_fn(self) -> ActorCriticLoss:
        return self._loss

    def finish_group(
        self, samples: list[Sample], extras: dict[str, Sample]
    ) -> list[Sample] | Filtered:
        return samples  # a critic gives a baseline: every sample carries signal

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        self.pad_id = pad_id(tokenizer)
        trainer.ensure_value_head()  # a language model gets a critic; a policy has one

    def _anneal(self, trainer: Any) -> None:
        if self.cfg.ppo.clip_schedule == "linear":
            left = max(0.0, 1.0 - trainer.global_step / self.total_steps)
            self.clip = self.cfg.clip_low * left

    def prepare(self, groups: list, trainer: Any, timer: Timer) -> Any:
        self._anneal(trainer)
        samples = [t for g in groups for t in g.trajectories]
        version, self.version = self.version, self.version + 1
        env = samples[0].environment  # environment steps, or a language model's tokens
        self._loss = self._make_loss(ActorCriticLoss if env else TokenActorCriticLoss)
        with timer("advantage"):
            if env:
                return self._prepare_segments(samples, trainer, version)
        return self._prepare_tokens(samples, trainer, timer)

    def _prepare_segments(self, segments: list[Segment], trainer: Any, version: int) -> Any:
        from streamrl.engines.train.policy import TransitionBatch

        s = stack_segments(segments)
        t_len, n = s["rewards"].shape
        flat = lambda x: x.reshape(t_len * n, *x.shape[2:])  # noqa: E731
        trainer.model.update_obs_stats(s["obs"])
        batch = TransitionBatch(
            obs=flat(s["obs"]),
            actions=flat(s["actions"]),
            logprobs=flat(s["logprobs"]),
            values=flat(s["values"]),
            advantages=torch.zeros(t_len * n),
            returns=torch.zeros(t_len * n),
        )
        values, last_values = s["values"], s["last_values"]
        stale = s["versions"] < version  # (T, N) steps played by older weights
        if self.decoupled and bool(stale.any()):
            values, last_values = self._decouple(batch, s, stale, trainer)
        if self.vtrace:  # values and log-probs under the weights about to be updated
            now = trainer.evaluate(batch)
            values = now["values"].reshape(t_len, n)
            last_values = trainer.evaluate_values(s["last_obs"])
            adv, returns = self._vtrace(s, values, last_values, now["logprobs"].reshape(t_len, n))
            batch.values = flat(values)
        else:
            adv, returns = self._gae(s, values, last_values)
        batch.advantages, batch.returns = flat(adv), flat(returns)
        return batch

    def _gae(
        self, s: dict[str, torch.Tensor], values: torch.Tensor, last_values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns) (T, N) of the stacked segments by GAE."""
        done = s["terminated"] | s["truncated"]
        nv = next_values(values, last_values, s["final_values"], done)
        p = self.cfg.ppo
        return gae(
            s["rewards"],
            values,
            nv,
            s["terminated"],
            s["truncated"],
            gamma=p.gamma,
            lam=p.gae_lambda,
        )

    def _vtrace(
        self,
        s: dict[str, torch.Tensor],
        values: torch.Tensor,
        last_values: torch.Tensor,
        target_lp: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns) (T, N) of the stacked segments by V-trace, the target
        policy's log-probs ``target_lp`` against the behaviour's."""
        done = s["terminated"] | s["truncated"]
        nv = next_values(values, last_values, s["final_values"], done)
        v = self.cfg.vtrace
        returns, adv = vtrace(
            s["logprobs"],
            target_lp,
            s["rewards"],
            values,
            nv,
            s["terminated"],
            s["truncated"],
            gamma=self.cfg.ppo.gamma,
            rho_bar=v.rho_bar,
            c_bar=v.c_bar,
        )
        return adv, returns

    def _decouple(
        self, batch: Any, s: dict[str, torch.Tensor], stale: torch.Tensor, trainer: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoupled PPO on the stale steps: one no-grad forward of the weights about to
        be updated (the proximal policy) gives the clip centre and the weights
        w = correction(pi_prox / pi_behave) (``batch.logprobs``, ``batch.weights``).

        Values: the proximal critic's too, for GAE, the value clip and explained
        variance. At eta = 0 the rollout's values are the weights-before-the-update
        critic's, which is what SB3 and CleanRL use; on stale steps that critic is the
        proximal one (the behaviour critic is one update older). Fresh steps keep the
        rollout's log-probs and values bit for bit (w = 1 exactly). ``final_values``
        (truncations) stay the rollout's: the final observations are not kept.
        Returns the (T, N) values and (N,) bootstrap values for the advantages.
        """
        t_len, n = stale.shape
        now = trainer.evaluate(batch)
        flat_stale = stale.reshape(-1)
        prox = torch.where(flat_stale, now["logprobs"], batch.logprobs)
        mask = torch.ones_like(flat_stale)
        batch.logprobs, batch.weights, _ = decoupled_old_policy(
            batch.logprobs, prox, mask, self._params
        )
        batch.values = torch.where(flat_stale, now["values"], batch.values)
        last_stale = stale[-1]  # (N,) the bootstrap: V(last_obs), after the last step
        last_values = torch.where(
            last_stale, trainer.evaluate_values(s["last_obs"]), s["last_values"]
        )
        return batch.values.reshape(t_len, n), last_values

    def _prepare_tokens(self, trajectories: list[Trajectory], trainer: Any, timer: Timer) -> Batch:
        batch = Batch.collate(trajectories, pad_id=self.pad_id)
        with timer("values"):
            batch.values = trainer.compute_values(batch) * batch.loss_mask
        batch.advantages, batch.returns = token_gae(
            batch, gamma=self.cfg.ppo.gamma, lam=self.cfg.ppo.gae_lambda
        )
        return batch


def token_gae(batch: Batch, *, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) advantages and returns of a batch with the critic's ``values``: each
    sequence is one episode over its generated tokens, the outcome reward at the last."""
    adv = torch.zeros_like(batch.values)
    ret = torch.zeros_like(batch.values)
    for i in range(batch.size):
        idx = batch.loss_mask[i].nonzero().squeeze(-1)
        if idx.numel() == 0:
            continue
        v = batch.values[i, idx][:, None]  # (T_i, 1)
        r = torch.zeros_like(v)
        r[-1] = batch.rewards[i]  # the outcome reward, at the last generated token
        term = torch.zeros_like(v, dtype=torch.bool)
        term[-1] = True
        nv = torch.cat([v[1:], torch.zeros(1, 1)])
        a_i, r_i = gae(r, v, nv, term, torch.zeros_like(term), gamma=gamma, lam=lam)
        adv[i, idx], ret[i, idx] = a_i[:, 0], r_i[:, 0]
    return adv, ret


@register_algorithm("ppo")
class PPO(ActorCritic):
    """PPO with a learned critic and GAE (``algorithm.name: ppo``)."""


@register_algorithm("appo")
class APPO(ActorCritic):
    """Asynchronous PPO: the critic's targets and the advantages by V-trace
    (``algorithm.name: appo``)."""

    vtrace = True

"""PPO with a learned critic: GAE (``algorithm.advantage: gae``) or V-trace (``vtrace``).

One algorithm for two kinds of experience:

- **environment segments** (:class:`~streamrl.core.types.Segment`, Gymnasium): the policy
  network's critic gave each step's value when the segment was played. ``gae`` uses
  those values with correct bootstrapping (a truncated episode is bootstrapped from
  V(final observation), a terminated one is not). ``vtrace`` (IMPALA/APPO) recomputes
  the values and log-probs under the current weights before the update and corrects
  for the behaviour policy being stale (eta >= 1) with truncated importance weights.
- **language-model trajectories**: token-level PPO as in the original RLHF recipe. A
  value head on the LM's last hidden state (zero-initialised, trained with the LM)
  scores every state; the outcome reward is given at the last generated token, GAE runs
  over the generated tokens only (observation tokens of an agent episode are skipped:
  the value after them is the next generated token's).

The loss (:class:`ActorCriticLoss`, a pure function of tensors) is PPO's clipped
surrogate, plus ``vf_coef`` times the (optionally clipped) value error, minus
``entropy_coef`` times the entropy, with advantages normalised per minibatch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from streamrl.algorithms.base import Algorithm, Filtered, Timer, register_algorithm
from streamrl.algorithms.losses import PolicyLossParams, decoupled_old_policy
from streamrl.algorithms.returns import gae, next_values, vtrace
from streamrl.core.types import Batch, Segment, Trajectory


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
    if mask is None:  # every op counts on a tiny network: the fused ATen reductions

        def mean(x: torch.Tensor) -> torch.Tensor:
            return x.mean()

        def var(x: torch.Tensor) -> torch.Tensor:  # population variance
            return torch.var(x, correction=0)

        def normalize(x: torch.Tensor) -> torch.Tensor:  # unbiased std, as SB3 and CleanRL
            if x.numel() < 2:
                return x - x.mean()
            std, mu = torch.std_mean(x)
            return (x - mu) / (std + 1e-8)

    else:
        n = mask.sum().clamp(min=1)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return torch.where(mask, x, 0.0).sum() / n

        def var(x: torch.Tensor) -> torch.Tensor:
            return mean((x - mean(x)) ** 2)

        def normalize(x: torch.Tensor) -> torch.Tensor:
            std = (var(x) * n / (n - 1).clamp(min=1)).sqrt()
            return (x - mean(x)) / (std + 1e-8)

    adv = normalize(advantages) if norm_advantages else advantages
    log_ratio = logprobs - old_logprobs
    if mask is not None:
        log_ratio = torch.where(mask, log_ratio, 0.0)
    log_ratio = log_ratio.clamp(-20, 20)
    ratio = log_ratio.exp()
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    policy = mean(surrogate if weights is None else weights * surrogate)
    err = (values - returns) ** 2
    if vf_clip is not None:
        clipped = old_values + (values - old_values).clamp(-vf_clip, vf_clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    value = 0.5 * mean(err)
    loss = policy + vf_coef * value
    if entropy_coef:  # else the entropy stays out of the graph: no backward through it
        ent = mean(entropy)
        loss = loss - entropy_coef * ent
    with torch.no_grad():
        ent = mean(entropy)
        excess = ratio - 1
        metrics = {
            "policy_loss": float(policy),
            "value_loss": float(value),
            "entropy": float(ent),
            "approx_kl": float(mean(excess - log_ratio)),
            "clip_frac": float(mean((excess.abs() > clip).float())),
            "explained_variance": float(
                1 - var(returns - old_values) / var(returns).clamp(min=1e-8)
            ),
        }
    return loss, metrics


@dataclass(frozen=True)
class ActorCriticLoss:
    """``loss_fn(outputs, batch)`` for either train engine (a dataclass: it pickles)."""

    clip: float
    vf_coef: float
    vf_clip: float | None
    entropy_coef: float
    norm_advantages: bool
    needs_values: bool = True  # the LM engine computes the value head's values
    needs_entropy: bool = True

    def loss_weight(self, batch: Any) -> int:
        return int(batch.loss_mask.sum()) if isinstance(batch, Batch) else batch.size

    def __call__(self, outputs: dict[str, torch.Tensor], batch: Any) -> tuple[torch.Tensor, dict]:
        if isinstance(batch, Batch):  # tokens: (N, T) with the loss mask
            old_lp, old_v, mask = batch.behavior_logprobs, batch.values, batch.loss_mask
        else:  # transitions: (M,)
            old_lp, old_v, mask = batch.logprobs, batch.values, None
        weights = getattr(batch, "weights", None)  # decoupled: corrected pi_prox / pi_behave
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


def stack_segments(segments: list[Segment]) -> dict[str, torch.Tensor]:
    """Concatenate segments along their environments: (T, sum N_i, ...)."""
    fields = (
        "obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated",
        "final_values",
    )  # fmt: skip
    out = {f: torch.cat([getattr(s, f) for s in segments], dim=1) for f in fields}
    out["last_obs"] = torch.cat([s.last_obs for s in segments], dim=0)
    out["last_values"] = torch.cat([s.last_values for s in segments], dim=0)
    # (T, sum N_i): the weight version of every step of every environment
    out["versions"] = torch.cat(
        [s.versions[:, None].expand(-1, s.rewards.shape[1]) for s in segments], 1
    )
    return out


@register_algorithm("vtrace")
@register_algorithm("gae")
class ActorCritic(Algorithm):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        a = cfg.algorithm
        self.vtrace = a.advantage == "vtrace"
        self._loss = ActorCriticLoss(
            clip=a.clip_low,
            vf_coef=a.vf_coef,
            vf_clip=a.vf_clip,
            entropy_coef=a.entropy_coef,
            norm_advantages=a.norm_advantages,
        )
        self.total_steps = max(1, cfg.train.steps * cfg.train.num_minibatches * cfg.train.epochs)
        self.pad_id = 0
        # decoupled PPO on stale segments (gae only: V-trace corrects them its own way)
        self.decoupled = a.decoupled and not self.vtrace and cfg.stream.max_staleness > 0
        self._params = PolicyLossParams(
            behave_imp_weight_cap=a.behave_imp_weight_cap,
            is_correction=a.is_correction,
            is_cap=a.is_cap,
            icepop_band=tuple(a.icepop_band),
        )
        self.version = 0  # the trainer's weight version: one per prepared batch

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state.get("version", self.version))

    @property
    def loss_fn(self) -> ActorCriticLoss:
        return self._loss

    def finish_group(self, samples: list[Any], extras: dict[str, Any]) -> list[Any] | Filtered:
        return samples  # a critic gives a baseline: every sample carries signal

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        if hasattr(trainer, "value_head"):  # a language model: give it a critic
            pad = getattr(tokenizer, "pad_token_id", None)
            self.pad_id = pad if pad is not None else 0
            if trainer.value_head is None:
                head = torch.nn.Linear(trainer.model.config.hidden_size, 1)
                torch.nn.init.zeros_(head.weight)
                torch.nn.init.zeros_(head.bias)
                trainer.value_head = head
                trainer.add_trainable(head)

    def _anneal(self, trainer: Any) -> None:
        a = self.cfg.algorithm
        if a.clip_schedule == "linear":
            left = max(0.0, 1.0 - trainer.global_step / self.total_steps)
            self._loss = replace(self._loss, clip=a.clip_low * left)

    def prepare(self, groups: list, trainer: Any, timer: Timer) -> Any:
        self._anneal(trainer)
        samples = [t for g in groups for t in g.trajectories]
        version, self.version = self.version, self.version + 1
        with timer("advantage"):
            if isinstance(samples[0], Segment):
                return self._prepare_segments(samples, trainer, version)
        return self._prepare_tokens(samples, trainer, timer)

    def _prepare_segments(self, segments: list[Segment], trainer: Any, version: int) -> Any:
        from streamrl.engines.train.policy import TransitionBatch

        a, s = self.cfg.algorithm, stack_segments(segments)
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
        done = s["terminated"] | s["truncated"]
        values, last_values, behave_lp = s["values"], s["last_values"], s["logprobs"]
        stale = s["versions"] < version  # (T, N) steps played by older weights
        if self.decoupled and bool(stale.any()):
            values, last_values = self._decouple(batch, s, stale, trainer)
        if self.vtrace:  # values and log-probs under the weights about to be updated
            now = trainer.evaluate(batch)
            values = now["values"].reshape(t_len, n)
            last_values = trainer.evaluate_values(s["last_obs"])
            target_lp = now["logprobs"].reshape(t_len, n)
        nv = next_values(values, last_values, s["final_values"], done)
        if self.vtrace:
            returns, adv = vtrace(
                behave_lp, target_lp, s["rewards"], values, nv, s["terminated"], s["truncated"],
                gamma=a.gamma, rho_bar=a.rho_bar, c_bar=a.c_bar,
            )  # fmt: skip
            batch.values = flat(values)
        else:
            adv, returns = gae(
                s["rewards"], values, nv, s["terminated"], s["truncated"],
                gamma=a.gamma, lam=a.gae_lambda,
            )  # fmt: skip
        batch.advantages, batch.returns = flat(adv), flat(returns)
        return batch

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
        a = self.cfg.algorithm
        batch = Batch.collate(trajectories, pad_id=self.pad_id)
        with timer("values"):
            batch.values = trainer.compute_values(batch) * batch.loss_mask
        adv = torch.zeros_like(batch.values)
        ret = torch.zeros_like(batch.values)
        for i in range(batch.size):  # each sequence: one episode over its generated tokens
            idx = batch.loss_mask[i].nonzero().squeeze(-1)
            if idx.numel() == 0:
                continue
            v = batch.values[i, idx][:, None]  # (T_i, 1)
            r = torch.zeros_like(v)
            r[-1] = batch.rewards[i]  # the outcome reward, at the last generated token
            term = torch.zeros_like(v, dtype=torch.bool)
            term[-1] = True
            nv = torch.cat([v[1:], torch.zeros(1, 1)])
            a_i, r_i = gae(r, v, nv, term, torch.zeros_like(term), gamma=a.gamma, lam=a.gae_lambda)
            adv[i, idx], ret[i, idx] = a_i[:, 0], r_i[:, 0]
        batch.advantages, batch.returns = adv, ret
        return batch

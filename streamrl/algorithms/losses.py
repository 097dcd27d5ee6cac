"""Token-level RL losses: pure tensor functions, registered by name.

All per-token tensors are (N, T) and aligned with ``Batch``: position t describes
token ``input_ids[:, t]``. ``mask`` is the loss mask (True on generated tokens);
values at masked-out positions are ignored, whatever they hold (padding garbage
included: they are zeroed with ``torch.where`` before any ``exp``, so they can
produce neither inf nor NaN, in the value or the gradient).

A policy loss has the signature (``PolicyLossFn``)

    fn(logprobs, behavior_logprobs, advantages, mask, *, proximal_logprobs=None,
       params: PolicyLossParams) -> (loss: scalar tensor, metrics: dict[str, float])

where ``logprobs`` carries the gradient and everything else is data.

Decoupled objective (AReaL): when ``proximal_logprobs`` (the weights before this
update) are given, the "old" policy of the ratio is pi_prox instead of pi_behave,
and every token loss is weighted by the detached pi_prox / pi_behave, which corrects
for the behaviour policy being stale. All three losses share this (``decoupled_old_policy``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from streamrl.algorithms.corrections import get_correction, mismatch_metrics
from streamrl.algorithms.registry import get_policy_loss, register_policy_loss
from streamrl.core.loss import LossFn
from streamrl.core.types import Batch

# Log-ratios are clamped here before exp: beyond e^20 a ratio carries no useful signal.
_LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------------------
# Aggregation: (N, T) per-token values -> scalar.
#
# Every mode is "sum of per-unit values / number of units", with units = tokens or
# sequences (those with at least one loss token). ``loss_weight`` returns that number
# of units; the train engine scales micro-batch k's loss by units_k / units_minibatch,
# which makes the accumulated gradient equal to the one-piece gradient in every mode.
# --------------------------------------------------------------------------------------


def _num_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum()


def _num_seqs(mask: torch.Tensor) -> torch.Tensor:
    return mask.any(-1).sum()


def _token_mean(values: torch.Tensor, mask: torch.Tensor, max_tokens: int | None) -> torch.Tensor:
    # DAPO: every token counts the same, so long answers are not down-weighted.
    return values.sum() / _num_tokens(mask).clamp(min=1)


def _seq_mean_token_mean(
    values: torch.Tensor, mask: torch.Tensor, max_tokens: int | None
) -> torch.Tensor:
    # Original GRPO: mean over each sequence's tokens, then over sequences.
    per_seq = values.sum(-1) / mask.sum(-1).clamp(min=1)  # (N,)
    return per_seq.sum() / _num_seqs(mask).clamp(min=1)


def _seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, max_tokens: int | None
) -> torch.Tensor:
    # Dr. GRPO: divide token sums by a constant (the generation budget), not the length.
    if max_tokens is None:
        raise ValueError(
            "agg_mode 'seq_mean_token_sum_norm' needs max_tokens (the generation budget)"
        )
    per_seq = values.sum(-1) / max_tokens  # (N,)
    return per_seq.sum() / _num_seqs(mask).clamp(min=1)


# mode -> (aggregate(values, mask, max_tokens), count of the units it averages over)
_AGGREGATIONS: dict[str, tuple[Callable, Callable]] = {
    "token_mean": (_token_mean, _num_tokens),
    "seq_mean_token_mean": (_seq_mean_token_mean, _num_seqs),
    "seq_mean_token_sum_norm": (_seq_mean_token_sum_norm, _num_seqs),
}
AGG_MODES = tuple(_AGGREGATIONS)


def _aggregation(mode: str) -> tuple[Callable, Callable]:
    if mode not in _AGGREGATIONS:
        raise ValueError(f"unknown agg_mode {mode!r}; known: {', '.join(AGG_MODES)}")
    return _AGGREGATIONS[mode]


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, *, max_tokens: int | None = None
) -> torch.Tensor:
    """values (N, T), mask (N, T) bool -> scalar. Empty masks give 0, not NaN."""
    agg, _ = _aggregation(mode)
    return agg(torch.where(mask, values, 0.0), mask, max_tokens)


def loss_weight(mask: torch.Tensor, mode: str) -> int:
    """Number of units (tokens or non-empty sequences) that ``aggregate`` divides by."""
    _, count = _aggregation(mode)
    return int(count(mask))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1))


# --------------------------------------------------------------------------------------
# Policy losses
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLossParams:
    """Hyper-parameters shared by the policy losses (each reads the fields it needs)."""

    clip_low: float = 0.2
    """PPO: ratio lower bound is 1 - clip_low."""
    clip_high: float = 0.28
    """PPO: ratio upper bound is 1 + clip_high (DAPO clip-higher; 0.2 is classic PPO)."""
    agg_mode: str = "token_mean"
    """One of AGG_MODES; also used for the KL and entropy terms."""
    max_tokens: int | None = None
    """Constant divisor of 'seq_mean_token_sum_norm' (Dr. GRPO): the generation budget."""
    behave_imp_weight_cap: float | None = None
    """Decoupled objective: tokens whose pi_prox/pi_behave exceeds this get weight 0
    (the 'mis' correction with this cap)."""
    is_correction: str = "none"
    """What to do with extreme pi_prox/pi_behave weights: none | tis | mis | icepop
    (see ``corrections.py``)."""
    is_cap: float = 2.0
    """tis / mis: the weight's cap."""
    icepop_band: tuple[float, float] = (0.5, 2.0)
    """icepop: weights outside [low, high] are masked."""
    gspo_clip_low: float = 3e-4
    """GSPO: sequence ratio lower bound is 1 - gspo_clip_low (GSPO paper values)."""
    gspo_clip_high: float = 4e-4
    """GSPO: sequence ratio upper bound is 1 + gspo_clip_high."""
    cispo_clip_high: float = 4.0
    """CISPO: importance weight is capped at 1 + cispo_clip_high (no lower bound)."""

    def __post_init__(self) -> None:
        _aggregation(self.agg_mode)
        if self.agg_mode == "seq_mean_token_sum_norm" and self.max_tokens is None:
            raise ValueError("agg_mode 'seq_mean_token_sum_norm' needs max_tokens")
        if self.behave_imp_weight_cap is not None and self.behave_imp_weight_cap <= 0:
            raise ValueError("behave_imp_weight_cap must be positive")
        get_correction(self.is_correction)  # fails early on an unknown name
        low, high = self.icepop_band
        if not 0 < low <= 1 <= high or self.is_cap <= 0:
            raise ValueError("need is_cap > 0 and icepop_band with 0 < low <= 1 <= high")


class PolicyLossFn(Protocol):
    """A registered policy loss (``register_policy_loss``)."""

    agg_mode: str | None
    """The aggregation the loss is defined with (GSPO: sequence-level), used for every
    term instead of ``params.agg_mode``; None: the configured one."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        behavior_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        proximal_logprobs: torch.Tensor | None = None,
        params: PolicyLossParams = ...,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def _log_ratio(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_theta / pi_old), (N, T); 0 at masked positions so exp() is always safe."""
    log_r = torch.where(mask, logprobs - old, 0.0)
    return log_r.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def decoupled_old_policy(
    behavior_logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    params: PolicyLossParams,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """-> (old logprobs (N, T), decoupled token weights (N, T) or None, metrics).

    Capped tokens get weight 0 but stay in the denominator (as in AReaL), so the
    normaliser depends only on the loss mask and micro-batch accumulation stays exact.
    """
    if proximal_logprobs is None:
        return behavior_logprobs, None, {}
    weight = _log_ratio(proximal_logprobs, behavior_logprobs, mask).exp().detach()  # (N, T)
    metrics = {"behave_weight_mean": _masked_mean(weight, mask)}
    cap = params.behave_imp_weight_cap
    if cap is not None:
        capped = mask & (weight > cap)
        metrics["capped_frac"] = float(capped.sum() / mask.sum().clamp(min=1))
        weight = torch.where(capped, 0.0, weight)
    weight, extra = get_correction(params.is_correction)(
        weight, mask, cap=params.is_cap, band=params.icepop_band
    )
    metrics.update(extra)
    return proximal_logprobs, weight, metrics


def _behavior_kl(logprobs: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor) -> float:
    """k3 estimate of KL(pi_behave || pi_theta) on the (behaviour-sampled) tokens."""
    with torch.no_grad():
        log_r = _log_ratio(logprobs, behavior, mask)
        return _masked_mean(log_r.exp() - 1 - log_r, mask)


@register_policy_loss("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    params: PolicyLossParams = PolicyLossParams(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate low/high clip (DAPO), decoupled if proximal given.

    loss_t = -w_t * min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t),
    r_t = pi_theta / pi_old, pi_old = pi_prox (else pi_behave), w_t = pi_prox / pi_behave (else 1).
    """
    old, weight, metrics = decoupled_old_policy(behavior_logprobs, proximal_logprobs, mask, params)
    ratio = _log_ratio(logprobs, old, mask).exp()  # (N, T)
    clipped = ratio.clamp(1 - params.clip_low, 1 + params.clip_high)
    loss_t = torch.maximum(-advantages * ratio, -advantages * clipped)  # -min(...)
    if weight is not None:
        loss_t = loss_t * weight
    loss = aggregate(loss_t, mask, params.agg_mode, max_tokens=params.max_tokens)

    # The clipped branch is active (zero gradient) only on the side that would over-step.
    with torch.no_grad():
        clip_active = mask & (
            ((advantages > 0) & (ratio > 1 + params.clip_high))
            | ((advantages < 0) & (ratio < 1 - params.clip_low))
        )
        metrics["clip_frac"] = float(clip_active.sum() / mask.sum().clamp(min=1))
        metrics["ratio_mean"] = _masked_mean(ratio, mask)
    metrics["approx_kl"] = _behavior_kl(logprobs, behavior_logprobs, mask)
    return loss, metrics


_GSPO_AGG = "seq_mean_token_mean"


@register_policy_loss("gspo", agg_mode=_GSPO_AGG)
def gspo(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    params: PolicyLossParams = PolicyLossParams(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (GSPO-token form): one length-normalised importance ratio per sequence.

    s_i = exp(mean_t log(pi_theta / pi_old)), s_i,t = sg[s_i] * pi_t / sg[pi_t]
    (value s_i, gradient s_i * grad log pi_t), clipped to [1 - gspo_clip_low,
    1 + gspo_clip_high]; always aggregated seq_mean_token_mean (``params.agg_mode`` is
    ignored).
    """
    old, weight, metrics = decoupled_old_policy(behavior_logprobs, proximal_logprobs, mask, params)
    log_r = _log_ratio(logprobs, old, mask)  # (N, T)
    seq_log_ratio = log_r.sum(-1) / mask.sum(-1).clamp(min=1)  # (N,) log s_i
    token_log_ratio = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()  # (N, T)
    ratio = token_log_ratio.exp()
    clipped = ratio.clamp(1 - params.gspo_clip_low, 1 + params.gspo_clip_high)
    loss_t = torch.maximum(-advantages * ratio, -advantages * clipped)
    if weight is not None:
        loss_t = loss_t * weight
    loss = aggregate(loss_t, mask, _GSPO_AGG)

    with torch.no_grad():
        clip_active = mask & (
            ((advantages > 0) & (ratio > 1 + params.gspo_clip_high))
            | ((advantages < 0) & (ratio < 1 - params.gspo_clip_low))
        )
        has_tokens = mask.any(-1)
        metrics["clip_frac"] = float(clip_active.sum() / mask.sum().clamp(min=1))
        metrics["seq_ratio_mean"] = _masked_mean(seq_log_ratio.exp(), has_tokens)
    metrics["approx_kl"] = _behavior_kl(logprobs, behavior_logprobs, mask)
    return loss, metrics


@register_policy_loss("cispo")
def cispo(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    params: PolicyLossParams = PolicyLossParams(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1): clip the importance weight, never the gradient.

    loss_t = -w_t * sg[min(r_t, 1 + cispo_clip_high)] * A_t * log pi_theta_t: every
    token keeps its gradient A_t * grad log pi_t, only its weight is capped.
    """
    old, weight, metrics = decoupled_old_policy(behavior_logprobs, proximal_logprobs, mask, params)
    ratio = _log_ratio(logprobs, old, mask).exp().detach()  # (N, T)
    is_weight = ratio.clamp(max=1 + params.cispo_clip_high)
    loss_t = -is_weight * advantages * logprobs
    if weight is not None:
        loss_t = loss_t * weight
    loss = aggregate(loss_t, mask, params.agg_mode, max_tokens=params.max_tokens)

    metrics["clip_frac"] = float(
        (mask & (ratio > 1 + params.cispo_clip_high)).sum() / mask.sum().clamp(min=1)
    )
    metrics["ratio_mean"] = _masked_mean(ratio, mask)
    metrics["approx_kl"] = _behavior_kl(logprobs, behavior_logprobs, mask)
    return loss, metrics


# --------------------------------------------------------------------------------------
# KL to a reference model, SFT, and the composed RL loss the train engine calls.
# --------------------------------------------------------------------------------------


def _k1(log_r: torch.Tensor) -> torch.Tensor:
    return log_r


def _k2(log_r: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_r**2


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    # exp(ref - logp) - (ref - logp) - 1: non-negative, low variance.
    neg = (-log_r).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return neg.exp() - neg - 1


_KL_ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from pi_theta.

    logprobs, ref_logprobs: (N, T) -> (N, T). With log_r = logp - ref (Schulman):
    k1 = log_r, k2 = log_r^2 / 2, k3 = exp(-log_r) + log_r - 1.
    """
    if kind not in _KL_ESTIMATORS:
        raise ValueError(f"unknown kl kind {kind!r}; known: {', '.join(_KL_ESTIMATORS)}")
    return _KL_ESTIMATORS[kind](logprobs - ref_logprobs)


class SFTLoss(LossFn):
    """Token-mean negative log-likelihood of ``batch.loss_mask`` tokens."""

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        nll = aggregate(-outputs["logprobs"], batch.loss_mask, "token_mean")
        return nll, {"nll": nll.item()}


sft_loss = SFTLoss()


@dataclass(frozen=True)
class RLLoss(LossFn):
    """loss_fn(outputs, batch) -> (loss, metrics) for ``TrainEngine.train_batch``.

    total = policy_loss + kl_coef * agg(kl(logp, ref)) - entropy_coef * agg(entropy).
    outputs: {"logprobs": (N, T), "entropy": (N, T)} from the engine; advantages,
    behaviour/proximal/reference logprobs come from the batch. A dataclass rather
    than a closure so it pickles across process / Ray boundaries.
    """

    policy_loss: str
    params: PolicyLossParams = PolicyLossParams()
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    # When the whole batch is one optimizer step, the weights at the start of the
    # step are the proximal policy: take its logprobs (detached) from this forward
    # instead of a separate pass. Only valid for num_minibatches == 1.
    proximal_from_current: bool = False

    def __post_init__(self) -> None:
        fn: PolicyLossFn = get_policy_loss(self.policy_loss)  # fails early on an unknown name
        pinned = fn.agg_mode
        if pinned is not None and pinned != self.params.agg_mode:
            object.__setattr__(self, "params", replace(self.params, agg_mode=pinned))
        if self.kl_kind not in _KL_ESTIMATORS:
            raise ValueError(
                f"unknown kl kind {self.kl_kind!r}; known: {', '.join(_KL_ESTIMATORS)}"
            )

    @property
    def needs_entropy(self) -> bool:
        """Whether the engine must keep the entropy's autograd graph."""
        return self.entropy_coef != 0.0

    def loss_weight(self, batch: Batch) -> int:
        """Units this loss averages over; the engine's micro-batch accumulation weight."""
        return loss_weight(batch.loss_mask, self.params.agg_mode)

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Batch
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        logprobs, mask, p = outputs["logprobs"], batch.loss_mask, self.params
        if batch.advantages is None:
            raise ValueError("batch.advantages is None: compute advantages before train_batch")
        adv = batch.advantages
        if adv.shape != mask.shape:
            raise ValueError(
                f"batch.advantages has shape {tuple(adv.shape)}, expected per-token "
                f"{tuple(mask.shape)} (the algorithm's prepare() broadcasts them)"
            )
        proximal = batch.proximal_logprobs
        if proximal is None and self.proximal_from_current:
            proximal = logprobs.detach()
        loss, metrics = get_policy_loss(self.policy_loss)(
            logprobs,
            batch.behavior_logprobs,
            adv,
            mask,
            proximal_logprobs=proximal,
            params=p,
        )
        metrics["policy_loss"] = loss.item()
        with torch.no_grad():  # the engine's numerics against the trainer's, same weights
            trainer_lp = proximal if proximal is not None else logprobs.detach()
            metrics.update(
                mismatch_metrics(trainer_lp, batch.behavior_logprobs, batch.versions, mask)
            )

        # Loss terms use the loss's aggregation; the metrics are plain token means.
        if self.kl_coef != 0.0:
            if batch.ref_logprobs is None:
                raise ValueError("kl_coef != 0 but batch.ref_logprobs is None")
            kl = kl_penalty(logprobs, batch.ref_logprobs, self.kl_kind)  # (N, T)
            loss = loss + self.kl_coef * aggregate(kl, mask, p.agg_mode, max_tokens=p.max_tokens)
            metrics["kl_ref"] = _masked_mean(kl.detach(), mask)

        if "entropy" in outputs:
            entropy = outputs["entropy"]  # (N, T)
            metrics["entropy"] = _masked_mean(entropy.detach(), mask)
            if self.entropy_coef != 0.0:
                ent = aggregate(entropy, mask, p.agg_mode, max_tokens=p.max_tokens)
                loss = loss - self.entropy_coef * ent
        elif self.entropy_coef != 0.0:
            raise ValueError("entropy_coef != 0 but outputs has no 'entropy'")
        return loss, metrics


def make_rl_loss_fn(
    policy_loss_name: str,
    params: PolicyLossParams | None = None,
    *,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    entropy_coef: float = 0.0,
    proximal_from_current: bool = False,
) -> RLLoss:
    """Compose a registered policy loss with optional KL and entropy terms."""
    return RLLoss(
        policy_loss_name,
        params if params is not None else PolicyLossParams(),
        kl_coef=kl_coef,
        kl_kind=kl_kind,
        entropy_coef=entropy_coef,
        proximal_from_current=proximal_from_current,
    )

"""Train/inference mismatch: measuring it, and correcting for it.

The engine that samples (``pi_behave``, its log-probs recorded per token) and the
trainer (``pi_prox``: the same weights, the trainer's own numerics) can disagree:
different kernels, batch shapes, a bf16 GPU engine. The decoupled objective already
weights each token by ``w = pi_prox / pi_behave``; a correction decides what to do
with extreme ``w`` (``algorithm.correction.kind``), each a pure function registered by
name:

- ``none``: w as it is;
- ``tis`` (truncated importance sampling): min(w, cap);
- ``mis`` (masked importance sampling): w, or 0 where w > cap (the token keeps its place
  in the normaliser);
- ``icepop``: w inside the band [low, high], 0 outside (both tails masked).

>>> import torch
>>> w = torch.tensor([[0.2, 1.0, 3.0]]); m = torch.ones(1, 3, dtype=torch.bool)
>>> get_correction("tis")(w, m, cap=2.0, band=(0.5, 2.0))[0].tolist()
[[0.20000000298023224, 1.0, 2.0]]
>>> get_correction("icepop")(w, m, cap=2.0, band=(0.5, 2.0))[0].tolist()
[[0.0, 1.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from streamrl.algorithms.registry import UnknownNameError

Correction = Callable[..., tuple[torch.Tensor, dict[str, float]]]
_CORRECTIONS: dict[str, Correction] = {}


def register_correction(name: str) -> Callable[[Correction], Correction]:
    def decorator(fn: Correction) -> Correction:
        _CORRECTIONS[name] = fn
        return fn

    return decorator


def get_correction(name: str) -> Correction:
    if name not in _CORRECTIONS:
        raise UnknownNameError(
            f"unknown importance-sampling correction {name!r}; known: {', '.join(sorted(_CORRECTIONS))}"
        )
    return _CORRECTIONS[name]


def _frac(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x & mask).sum() / mask.sum().clamp(min=1))


@register_correction("none")
def no_correction(w, mask, *, cap, band):
    return w, {}


@register_correction("tis")
def truncated(w, mask, *, cap, band):
    """min(w, cap): (N, T) -> (N, T)."""
    return w.clamp(max=cap), {"is/truncated_frac": _frac(w > cap, mask)}


@register_correction("mis")
def masked(w, mask, *, cap, band):
    """w, or 0 where w > cap."""
    over = w > cap
    return torch.where(over, 0.0, w), {"is/masked_frac": _frac(over, mask)}


@register_correction("icepop")
def icepop(w, mask, *, cap, band):
    """w inside [band[0], band[1]], 0 outside."""
    low, high = band
    out = (w < low) | (w > high)
    return torch.where(out, 0.0, w), {"is/masked_frac": _frac(out, mask)}


def mismatch_metrics(
    trainer_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    versions: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """How far the trainer's log-probs are from the engine's on the tokens that the
    batch's newest weights produced (the trainer's own weights before the update), all
    (N, T): the k3 estimate of KL(engine || trainer) and statistics of the ratio."""
    newest = mask & (versions == versions[mask].max()) if mask.any() else mask
    if not newest.any():
        return {}
    log_r = (trainer_logprobs - behavior_logprobs)[newest].clamp(-20, 20)
    ratio = log_r.exp()
    # k3 = r - 1 - log r ~ log_r^2 / 2: in float64 with expm1, or a float32 gap of
    # 1e-5 nats per token (fp16 engine weights) would cancel to exactly 0
    k3 = torch.expm1(log_r.double()) - log_r.double()
    return {
        "mismatch/kl": float(k3.mean()),
        "mismatch/ratio_mean": float(ratio.mean()),
        "mismatch/ratio_min": float(ratio.min()),
        "mismatch/ratio_max": float(ratio.max()),
        "mismatch/abs_log_ratio_mean": float(log_r.abs().mean()),
    }

"""Logits processing and batch-independent deterministic sampling.

Two pure pieces the inference engine composes once per decode step:

- :func:`sampling_logits` applies temperature, then top-k, then top-p (greedy
  rows keep the raw logits); their softmax is the distribution a token is
  drawn from, and :func:`sampling_logprobs` is its log-softmax, the exact
  behaviour log-prob the engine returns for every sampled token (also the
  reference for recomputing it elsewhere).
- :func:`sample` draws one token per row by inverse-CDF with a single uniform
  per row taken from :func:`counter_uniform`, a counter-based hash of
  ``(request seed, token position)``. The noise depends on nothing else (not
  the batch, not the slot, not a global RNG), so a request yields the same
  tokens alone or batched with others, and every run is reproducible.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
from numpy.typing import ArrayLike

# splitmix64 constants (Steele, Lea & Flood 2014)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_INF = float("inf")


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """Finaliser of splitmix64 on a uint64 array (wraps modulo 2**64 by design)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def counter_uniform(seeds: ArrayLike, positions: ArrayLike) -> torch.Tensor:
    """One uniform in [0, 1) per (seed, position) pair, float64, shape (B,).

    A pure function of its inputs: hash(hash(seed) + golden * (position + 1)),
    with splitmix64 as the hash. Seeds must already fit in 64 bits (reduce
    Python ints with ``seed & (2**64 - 1)``).

    >>> a = counter_uniform([7, 7, 8], [0, 1, 0])
    >>> bool((a == counter_uniform([7, 7, 8], [0, 1, 0])).all()), len(set(a.tolist()))
    (True, 3)
    """
    s = np.asarray(seeds, dtype=np.uint64)
    p = np.asarray(positions, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        z = _splitmix64(_splitmix64(s + _GOLDEN) + p * _GOLDEN)
    # top 53 bits -> exactly representable double in [0, 1)
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return torch.from_numpy(u)


def shifted_uniform(u: torch.Tensor, shift: ArrayLike) -> torch.Tensor:
    """frac(u + shift): still uniform on [0, 1) for any fixed shift, so a request's tokens
    keep their exact distribution; a zero shift returns ``u`` bit for bit. G requests
    sharing u with shifts j/G draw one systematic sample of size G (stratified groups)."""
    return torch.remainder(u + torch.as_tensor(shift, dtype=u.dtype), 1.0)


def context_key(seed: int, tokens: ArrayLike) -> np.uint64:
    """The noise key of a stratified request at the start: its seed and its prompt,
    hashed. Requests of one group that share a context share its key, and so its
    uniforms (:func:`fold_tokens` carries the key along the generated tokens)."""
    digest = zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes())
    with np.errstate(over="ignore"):
        return _splitmix64(np.asarray([seed], dtype=np.uint64) + np.uint64(digest) * _GOLDEN)[0]


def fold_tokens(keys: np.ndarray, tokens: ArrayLike) -> np.ndarray:
    """Each key after one more generated token: equal keys stay equal only on equal tokens,
    so group members that took different tokens draw independent uniforms from then on."""
    t = np.asarray(tokens, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        return _splitmix64(keys + t * _GOLDEN)


_I64 = 1 << 63


def check_params(temperature: float, top_k: int, top_p: float) -> None:
    """Raises ValueError unless the sampler can take these: finite numbers, and a top-k
    that fits in 64 bits. Every finite value is served (see :func:`sampling_logits`)."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not isinstance(top_k, int) or not -_I64 <= top_k < _I64:
        raise ValueError(f"top_k must be a 64-bit integer, got {top_k!r}")


def is_raw(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether a request samples from softmax(raw logits) or greedily: its log-probs are
    the raw log-softmax (what a forward gives, and vLLM's prompt log-probs)."""
    return temperature <= 0 or (temperature == 1.0 and top_k <= 0 and top_p >= 1.0)


def sampling_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Log-probs of the sampling distribution of each row: the log-softmax of
    :func:`sampling_logits` (same arguments). Use it to recompute behaviour
    log-probs of given tokens exactly as the engine defines them."""
    return torch.log_softmax(sampling_logits(logits, temperature, top_k, top_p), dim=-1)


def sampling_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Temperature-scaled, filtered logits whose softmax is the sampling distribution.

    logits:      (B, V) float   raw next-token logits
    temperature: (B,)   float   0 means greedy (row keeps the raw log-softmax)
    top_k:       (B,)   long    0 disables; keeps the k largest (ties at the k-th kept)
    top_p:       (B,)   float   1.0 disables; keeps the smallest prefix of the sorted
                                distribution whose mass reaches top_p (at least one token)
    returns:     (B, V) float32 masked, temperature-scaled logits; filtered
                                tokens are -inf

    The order (temperature, top-k, top-p on the renormalised top-k set) matches
    Hugging Face's default warper order. For any finite parameters every row keeps at
    least its most likely token (the argmax): a temperature so small that the scaled
    logits overflow scales them after subtracting the row's largest, a top-p of 0 (or
    below the first token's mass) keeps the first token, and a row's processing depends on
    that row alone (a row with top_p = 1 drops nothing, whatever its neighbours ask).
    """
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits)
    scaled = logits if bool((temp == 1.0).all()) else _scaled(logits, temp)
    # filters only apply to sampled rows; skip the sort/top-k entirely when unused
    k = torch.where(greedy, torch.zeros_like(top_k), top_k)
    p = torch.where(greedy, torch.ones_like(top_p), top_p).to(logits)
    use_k, use_p = bool((k > 0).any()), bool((p < 1.0).any())
    if use_p:
        scaled = _filter_top_k_top_p(scaled, k, p)
    elif use_k:
        scaled = _filter_top_k(scaled, k)
    return scaled


def _scaled(logits: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """logits / temperature per row; a row that overflows (a tiny temperature) is scaled
    after subtracting its largest logit, which keeps its argmax at 0 and finite."""
    scaled = logits / temp[:, None]
    over = torch.isinf(scaled).any(-1)
    if bool(over.any()):
        shifted = (logits - logits.amax(-1, keepdim=True)) / temp[:, None]
        scaled = torch.where(over[:, None], shifted, scaled)
    return scaled


def _filter_top_k(scaled: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Masks everything below each row's k-th largest value. (B, V) -> (B, V)."""
    vocab = scaled.shape[-1]
    k = k.clamp(max=vocab)
    kmax = int(k.max())
    top = torch.topk(scaled, kmax, dim=-1).values  # (B, kmax), descending
    kth = top.gather(1, (k.clamp(min=1) - 1)[:, None])  # (B, 1)
    kth = torch.where(k[:, None] > 0, kth, torch.full_like(kth, -float("inf")))
    return scaled.masked_fill(scaled < kth, -float("inf"))


def _filter_top_k_top_p(scaled: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p in sorted space, scattered back. (B, V) -> (B, V)."""
    if bool((k > 0).any()):
        scaled = _filter_top_k(scaled, k)
    sorted_vals, order = torch.sort(scaled, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_vals, dim=-1)
    # mass strictly before each token; a token is kept while that mass < top_p, so the
    # kept set is the minimal prefix. The first token is kept whatever top_p (0 included),
    # and a row with top_p = 1 keeps everything (its cumsum may round past 1 at the tail)
    before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = (before >= p[:, None]) & (p[:, None] < 1.0)
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return scaled.masked_fill(drop, -float("inf"))


def sample(
    scores: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
    block: int = 256,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws one token per row; returns (tokens (B,) long, their log-probs (B,) float32).

    scores:   (B, V) from :func:`sampling_logits` (or :func:`sampling_logprobs`:
              the distribution is softmax(scores) either way)
    greedy:   (B,)   bool, argmax rows (first index on ties); their log-prob is
              the log-softmax of ``scores``, i.e. of the raw logits
    uniforms: (B,)   float64 in [0, 1), e.g. from :func:`counter_uniform`
    traced:   inside a compiled graph: no host sync (the argmax is taken for every
              row, not only when some row is greedy); the same tokens and log-probs

    Inverse CDF: the token is the first index whose cumulative probability
    exceeds ``u * total``. Zero-probability (filtered) tokens add nothing to the
    CDF, so they can never be picked. Two levels keep it cheap for a large
    vocabulary: float64 sums of blocks of ``block`` tokens pick the block, then
    a cumsum inside that one block picks the token (4 passes over (B, V) in all).
    """
    b, v = scores.shape
    nb = -(-v // block)
    row_max = scores.amax(dim=-1, keepdim=True)  # (B, 1); 12x cheaper than max(dim) on CPU
    if traced:  # a graph takes no out= into a view; the compiler fuses the pad anyway
        unnorm = torch.nn.functional.pad(scores - row_max, (0, nb * block - v), value=-_INF)
    else:  # eager: one write of (B, V), no temporary
        unnorm = scores.new_empty((b, nb * block))
        unnorm[:, v:] = -_INF  # padding: exp -> 0
        torch.sub(scores, row_max, out=unnorm[:, :v])
    unnorm.exp_()  # (B, nb*block), unnormalised probs in (0, 1]
    blocks = unnorm.view(b, nb, block)
    block_cdf = blocks.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # (B, nb)
    total = block_cdf[:, -1:]  # (B, 1)
    # strictly below the total, so some block's cdf exceeds it
    target = torch.minimum(
        uniforms.to(scores.device)[:, None] * total, torch.nextafter(total, torch.zeros_like(total))
    )
    bi = torch.searchsorted(block_cdf, target, right=True).clamp_(max=nb - 1)  # (B, 1)
    before = torch.where(
        bi > 0, block_cdf.gather(1, (bi - 1).clamp_(min=0)), torch.zeros_like(target)
    )
    inner = blocks.gather(1, bi[:, :, None].expand(b, 1, block)).squeeze(1)  # (B, block)
    ii = torch.searchsorted(inner.double().cumsum(dim=-1), target - before, right=True)
    ii = ii.clamp_(max=block - 1)
    # rounding between the block sum and its cumsum can land past the block's last
    # positive entry: take that entry instead, so a filtered token is never drawn
    last_pos = torch.where(inner > 0, torch.arange(block, device=scores.device), -1).amax(
        -1, keepdim=True
    )
    ii = torch.where(inner.gather(1, ii) > 0, ii, last_pos)
    tokens = (bi * block + ii).squeeze(1)
    if traced or bool(greedy.any()):
        tokens = torch.where(greedy.to(scores.device), scores.argmax(dim=-1), tokens)
    log_z = row_max.squeeze(1) + total.squeeze(1).log().float()  # log-sum-exp per row
    return tokens, scores.gather(1, tokens[:, None]).squeeze(1) - log_z

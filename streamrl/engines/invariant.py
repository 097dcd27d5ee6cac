"""Batch-invariant numerics: what one row computes does not depend on the other rows.

The engine batches whatever is in flight into one forward per step (``kv_cache``), so a
request shares its matrix products with requests that came and went by timing. On the
CPU, a product's result for one row depends on the shape of the call, not only on that
row: MKL's sgemm computes a row differently when the call has 1 row (a matrix-vector
kernel), 2-3 rows, or 4 and more; with two threads, 5-7 and 9-11 rows differ again.
Attention's products also depend on the number of keys below 16-20. So the same prompt
gave other log-probs (and, now and then, other tokens) alone than batched, and runs at
``stream.max_staleness=0`` whose refills landed at other moments drifted apart.

Measured on this CPU (``tests/unit/engines/test_batch_invariance.py`` checks it wherever it runs),
the result for a row is the same for every call whose row count is a multiple of 16,
whatever the other rows hold, where the row sits, and (for attention) how many masked
keys follow the visible ones once there are at least 16. So batch-invariant numerics
are a padding discipline, with no kernel of their own:

- every matrix product runs on a multiple of :data:`ROWS` rows: the engine pads a
  step's flat token axis (a linear layer's rows) and the rows its vocabulary head reads
  with rows that are computed and thrown away;
- attention runs over a multiple of :data:`KEYS` keys (the cache is sized to one), with
  the query rows of one kv head (decode: one token's query heads; prefill: a prompt's
  tokens times its query heads) padded to a multiple of :data:`ROWS`: a decode row, a
  prompt's row and a row whose prefix KV was copied from another slot all compute the
  same numbers (:func:`attention`);
- everything else in a step works row by row already (norms, RoPE, the MLP's
  activation, sampling).

The trainer computes the same numbers for every token under the same setting
(``TrainEngine(batch_invariant=True)``): its positions padded alike, attention through
:func:`sequence_attention` (a row's keys in position order, packed rows per segment),
and one log-prob formula, :func:`token_logprobs`. Equal weights give equal log-probs
on both sides (``mismatch/kl`` = 0).

What is still not fixed is the thread count: MKL splits a product among threads by its
shape, and for a few shapes (e.g. a 101-token vocabulary head at 4 or 8 threads) the
split changes the sums. A run's engine keeps its thread count for its whole life
(``runtime.rollout_threads``), so this costs nothing in reproducibility; only a step
driven at another count (``runtime.lend_cores``, never at eta = 0) or thread counts
chosen from measured times (``runtime.placement: auto``) may differ.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ROWS = 16  # every product runs on a multiple of this many rows
KEYS = 16  # attention runs over a multiple of this many keys
# the trainer's attention implementation (a transformers attention-interface name)
ATTN_IMPL = "streamrl_invariant"


def round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def pad_rows(x: torch.Tensor, multiple: int = ROWS, dim: int = 0) -> torch.Tensor:
    """``x`` with zero rows appended along ``dim`` up to a multiple of ``multiple``
    (``x`` itself when it already is one)."""
    n = x.shape[dim]
    extra = round_up(max(n, 1), multiple) - n
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of ``q`` (B, M, D) over ``keys``/``values`` (B, L, D) under an
    additive ``mask`` broadcastable to (B, M, L) (0 visible, dtype-min hidden) -> (B, M, D).

    The rows of each of the B products are padded to a multiple of :data:`ROWS`, and
    ``L`` must be a multiple of :data:`KEYS` with the visible keys of every row first
    (hidden keys after them only add exact zeros): a row's result is then the same
    whatever B, M, L and the other rows are.
    """
    b, m, _ = q.shape
    if keys.shape[1] % KEYS:
        raise ValueError(f"attention over {keys.shape[1]} keys, not a multiple of {KEYS}")
    mp = round_up(m, ROWS)
    if mask.shape[-2] not in (1, mp):  # a row of its own per query: pad it like the queries
        mask = F.pad(mask, (0, 0, 0, mp - m))
    scores = torch.baddbmm(
        mask.expand(b, mp, -1), pad_rows(q, dim=1), keys.transpose(1, 2), alpha=scale
    )
    return torch.bmm(scores.softmax(-1), values)[:, :m]


def causal_mask(
    start: int, rows: int, repeat: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The additive mask for :func:`attention` of the queries at positions ``start`` ..
    ``start + rows - 1`` of one sequence, each ``repeat`` times in a row (the query heads
    that share a kv head, head-major), over ``round_up(start + rows, KEYS)`` keys: query
    at position i sees keys 0..i. Returns (1, M, L), M padded to a multiple of ROWS."""
    length = round_up(start + rows, KEYS)
    pos = torch.arange(start, start + rows, device=device)
    hidden = torch.arange(length, device=device)[None] > pos[:, None]  # (rows, L)
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device)
    mask.masked_fill_(hidden, torch.finfo(dtype).min)
    return pad_rows(mask.repeat(repeat, 1))[None]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token) and the log-sum-exp of each row of ``logits`` (..., V) at ``tokens``
    (...): the one formula the trainer and the batch-invariant engine both use, so that
    equal logits give equal log-probs."""
    lse = logits.logsumexp(-1)
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - lse, lse


def sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function (``ATTN_IMPL``) computing what the batch-invariant
    engine computes for each token: :func:`attention` per (row, kv head).

    query (n, H, t, D), key/value (n, H_kv, t, D) with ``t`` a multiple of :data:`KEYS`;
    attention_mask: transformers' sdpa mask (n, 1, t, t) bool (True = visible) or None
    (causal). Each query must see a prefix of its row's keys (causal, right padding):
    rows packed side by side are not supported. Returns (n, t, H, D). An engine step of
    a model that has this attention (``slot_cache``) attends through its cache."""
    if kwargs.get("slot_cache") is not None:
        return kwargs["slot_cache"].attend(module.layer_idx, query, key, value, scaling), None
    if dropout:
        raise ValueError(f"{ATTN_IMPL} has no attention dropout (got {dropout})")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if kwargs.get("segments") is not None:  # rows packed side by side
        return _segment_attention(query, key, value, kwargs["segments"], scale), None
    n, h, t, d = query.shape
    kvh = key.shape[1]
    rep = h // kvh
    if attention_mask is None:
        visible = torch.ones(t, t, dtype=torch.bool, device=query.device).tril()[None, None]
    elif attention_mask.dtype == torch.bool:
        visible = attention_mask
    else:
        raise ValueError(f"{ATTN_IMPL} takes a boolean mask, not {attention_mask.dtype}")
    mask = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
    mask = mask.masked_fill(~visible, torch.finfo(query.dtype).min).expand(n, 1, t, t)
    # the queries of kv head j: its rep query heads, head-major -> (n * H_kv, rep * t, D)
    q = query.reshape(n * kvh, rep * t, d)
    m = mask.expand(n, rep, t, t).reshape(n, 1, rep * t, t).expand(n, kvh, rep * t, t)
    o = attention(
        q,
        key.reshape(n * kvh, t, d),
        value.reshape(n * kvh, t, d),
        pad_rows(m.reshape(n * kvh, rep * t, t), dim=1),
        scale,
    )
    return o.reshape(n, h, t, d).transpose(1, 2), None


def _segment_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: Any, scale: float
) -> torch.Tensor:
    """:func:`sequence_attention` of a packed row (query (1, H, T, D), key/value
    (1, H_kv, T, D)): each segment's queries over its own keys, gathered in position
    order (``packing.Segments``), so a packed token computes what it computes alone.
    Returns (1, T, H, D); tokens in no segment (padding) get zeros."""
    _, h, t, d = query.shape
    kvh = key.shape[1]
    rep = h // kvh
    s, q_len = segments.queries.shape
    length = segments.keys.shape[1]
    # flat position t is the padding: a zero key and value, a query thrown away
    keys = F.pad(key[0], (0, 0, 0, 1))[:, segments.keys]  # (H_kv, S, L, D)
    values = F.pad(value[0], (0, 0, 0, 1))[:, segments.keys]
    queries = F.pad(query[0], (0, 0, 0, 1))[:, segments.queries]  # (H, S, Q, D)
    q = queries.view(kvh, rep, s, q_len, d).permute(2, 0, 1, 3, 4).reshape(s * kvh, -1, d)
    hidden = torch.arange(length, device=query.device) > segments.qpos[..., None]  # (S, Q, L)
    mask = torch.zeros(hidden.shape, dtype=query.dtype, device=query.device)
    mask = mask.masked_fill(hidden, torch.finfo(query.dtype).min)
    mask = mask[:, None, None].expand(s, kvh, rep, q_len, length).reshape(s * kvh, -1, length)
    o = attention(
        q,
        keys.transpose(0, 1).reshape(s * kvh, length, d),
        values.transpose(0, 1).reshape(s * kvh, length, d),
        pad_rows(mask, dim=1),
        scale,
    )  # (S * H_kv, rep * Q, D)
    o = o.reshape(s, kvh, rep, q_len, d).permute(1, 2, 0, 3, 4).reshape(h, s * q_len, d)
    flat = segments.queries.reshape(-1)
    real = flat < t
    out = query.new_zeros(h, t, d).index_copy(1, flat[real], o[:, real])
    return out.transpose(0, 1)[None]


AttentionInterface.register(ATTN_IMPL, sequence_attention)
AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


def prefill_attention(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """A prompt's attention in the engine, by the decode rows' kernel (:func:`attention`):
    its rows compute what they would decoding, whatever prefix another slot lent it.

    q: (H, t_new, D) the queries of the positions computed; kbuf, vbuf: (H_kv, C, D) the
    slot's buffers, already holding the prompt's keys; mask: the queries'
    :func:`causal_mask` (1, M, L). Returns (t_new, H, D)."""
    h, t_new, d = q.shape
    kvh, length = kbuf.shape[0], mask.shape[-1]
    # the query heads of kv head j are j * rep .. j * rep + rep - 1
    rows = q.reshape(kvh, h // kvh * t_new, d)
    o = attention(rows, kbuf[:, :length], vbuf[:, :length], mask, scale)
    return o.reshape(h, t_new, d).transpose(0, 1)

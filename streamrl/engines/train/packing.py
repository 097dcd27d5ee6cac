"""Packed forward for the trainer: no padding, and a group's prompt computed once.

A micro-batch of right-padded rows spends FLOPs twice over: on padding (rows shorter
than the longest), and on repeats (a GRPO group is ``group_size`` completions of one
prompt). On the SmolLM2 workload of the performance issue (chat prompts of ~40 tokens,
completions of 5-48) 16 rows of up to 88 positions hold 2 prompts and ~430 completion
tokens: about 510 positions of real work out of ~1400.

The packed layout puts each distinct prompt once, then every row's remaining tokens,
on one flat token axis of length T::

    [ prompt a | prompt b | rest of row 0 | rest of row 1 | ... | rest of row n-1 ]

Each token keeps its own position id (a row's rest continues its prompt), and a
(T, T) boolean mask lets a token see its own prompt, and earlier tokens of its own
segment, only. That is the one-piece forward of every row, up to float rounding
(``tests/unit/engines/test_packing.py``), computed in one decoder call; backward sums each prompt's
gradient over its group's rows by construction.

Which rows share: rows whose tokens before their first loss token are identical (the
prompt of a single-turn item; the first prompt of a multi-turn episode); the shared
part stops one token short of a row's end, so each row keeps a segment of its own.
The mask is dense, so attention costs T^2 instead of the rows' sum of squares. Per
layer, with hidden width D, the linear layers cost about 2 * 12 D^2 FLOPs a position
(Llama's projections and MLP) and attention about 4 D per (query, key) pair, so the
layout is used when ``T * 6D + T^2`` is at most ``1 - MIN_SAVING`` of the padded
``n t * 6D + n t^2``, and T is at most ``MAX_TOKENS`` (the mask's memory); otherwise the
caller runs the ordinary padded forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from streamrl.engines import invariant

# Fraction of the padded forward's estimated FLOPs packing must save to be used.
MIN_SAVING = 0.2
# Largest packed length: the dense (T, T) boolean mask takes T^2 bytes.
MAX_TOKENS = 8192


@dataclass
class Segments:
    """Each segment's tokens as a sequence of its own, for attention that wants a query's
    keys in position order (``invariant.sequence_attention``). Segment s (a prompt, or a
    row's rest) has its queries at flat positions ``queries[s]`` and sees the keys at
    flat positions ``keys[s]``, in position order (a rest: its prompt's, then its own);
    the query at ``queries[s, i]`` sees ``keys[s, :qpos[s, i] + 1]``. Padding is flat
    position T (one past the tokens) and qpos -1."""

    keys: torch.Tensor  # (S, L) long, L a multiple of invariant.KEYS
    queries: torch.Tensor  # (S, Q) long
    qpos: torch.Tensor  # (S, Q) long

    def to(self, device: torch.device) -> Segments:
        return Segments(self.keys.to(device), self.queries.to(device), self.qpos.to(device))


@dataclass
class PackedLayout:
    """ids, pos (1, T); mask (1, 1, T, T) bool; the hidden state at flat position
    ``src[k]`` belongs at ``(row[k], col[k])`` of the (n, t) batch. ``segments`` (with
    ``pack(batch_invariant=True)``) lays the same tokens out per segment."""

    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    src: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    shared_prompts: int  # rows that reuse another row's prompt
    segments: Segments | None = None

    @property
    def tokens(self) -> int:
        return self.ids.shape[1]


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    width: int,
    min_saving: float = MIN_SAVING,
    max_tokens: int = MAX_TOKENS,
    batch_invariant: bool = False,
) -> PackedLayout | None:
    """The packed layout of a right-padded batch for a decoder of hidden size ``width``,
    or None when it would not pay (or the rows are not right-padded).
    ``batch_invariant``: the flat axis is padded to a multiple of ``invariant.ROWS``
    tokens (each seeing itself only), and the layout carries its :class:`Segments`."""
    att = attention_mask.cpu()
    cut = _prompt_cuts(att, loss_mask.cpu())
    if cut is None:
        return None
    lengths = att.sum(1).tolist()
    flat = _flatten(input_ids.cpu().tolist(), lengths, cut)
    n, total, t_max = len(cut), len(flat.tokens), max(lengths)
    packed_cost = total * 6 * width + total**2
    padded_cost = n * t_max * 6 * width + n * t_max**2
    if total > max_tokens or packed_cost > (1 - min_saving) * padded_cost:
        return None
    return _layout(flat, cut, batch_invariant, input_ids.device)


def _prompt_cuts(att: torch.Tensor, loss: torch.Tensor) -> list[int] | None:
    """Where each row's own tokens start: at its first loss token, but one short of its
    end at the latest (a row keeps a segment of its own); None when a row is not
    right-padded or has nothing before that point."""
    t = att.shape[1]
    row_len = att.sum(1)
    if not bool((att == (torch.arange(t) < row_len[:, None])).all()):
        return None  # real tokens must come first (collate right-pads)
    first_loss = torch.where(loss.any(1), loss.int().argmax(1), row_len)
    cut = torch.minimum(first_loss, row_len - 1).tolist()
    if min(cut) < 1:
        return None  # a row with nothing before its first loss token (or one token long)
    return cut


@dataclass
class _Flat:
    """The flat token axis: each distinct prompt once, then every row's rest. Segment s
    starts at ``start[s]`` with position id ``pos0[s]``; ``parent[s]`` is the prompt a
    rest attends to (-1 for a prompt); ``row_prompt[r]`` is row r's prompt segment."""

    tokens: list[int]
    start: list[int]
    pos0: list[int]
    parent: list[int]
    row_prompt: list[int]

    @property
    def prompts(self) -> int:
        return len(self.start) - len(self.row_prompt)


def _flatten(rows: list[list[int]], lengths: list[int], cut: list[int]) -> _Flat:
    """Lay out the rows' distinct prompts, then their rests, on one token axis."""
    flat = _Flat([], [], [], [], [])
    prompt_of: dict[tuple[int, ...], int] = {}  # prompt tokens -> its segment
    for r, row in enumerate(rows):
        key = tuple(row[: cut[r]])
        if key not in prompt_of:
            prompt_of[key] = len(flat.start)
            flat.start.append(len(flat.tokens))
            flat.pos0.append(0)
            flat.parent.append(-1)
            flat.tokens += key
        flat.row_prompt.append(prompt_of[key])
    for r, row in enumerate(rows):
        flat.start.append(len(flat.tokens))
        flat.pos0.append(cut[r])
        flat.parent.append(flat.row_prompt[r])
        flat.tokens += row[cut[r] : lengths[r]]
    return flat


def _layout(
    flat: _Flat, cut: list[int], batch_invariant: bool, device: torch.device
) -> PackedLayout:
    """The tensors of a packed layout: ids, positions, the attention mask, and where
    each state goes back to in the (n, t) batch."""
    n, total, n_prompts = len(cut), len(flat.tokens), flat.prompts
    bounds = torch.tensor(flat.start + [total])
    seg_len = bounds[1:] - bounds[:-1]
    seg = torch.repeat_interleave(torch.arange(len(flat.start)), seg_len)  # (T,)
    pos = torch.arange(total) - bounds[:-1][seg] + torch.tensor(flat.pos0)[seg]
    parent = torch.tensor(flat.parent)[seg]
    segments, extra = None, 0
    if batch_invariant:  # padding tokens: segments of their own, at position 0
        extra = invariant.round_up(total, invariant.ROWS) - total
        segments = _segments(flat.start, flat.parent, seg_len.tolist(), flat.pos0, total + extra)
        seg = torch.cat([seg, torch.arange(len(flat.start), len(flat.start) + extra)])
        parent = F.pad(parent, (0, extra), value=-1)
    q, k = torch.arange(total + extra)[:, None], torch.arange(total + extra)[None]
    own = (seg[:, None] == seg[None]) & (k <= q)
    mask = own | (parent[:, None] == seg[None])  # a rest sees all of its prompt

    # back to (n, t): a row's prompt's last state predicts its first own token, then
    # its own tokens' states (the loss tokens read only these)
    p_last = bounds[torch.tensor(flat.row_prompt)] + torch.tensor(cut) - 1
    rest_len = seg_len[n_prompts:]
    src = torch.cat([p_last, torch.arange(bounds[n_prompts], total)])
    row = torch.cat([torch.arange(n), torch.repeat_interleave(torch.arange(n), rest_len)])
    col = torch.cat([torch.tensor(cut) - 1, pos[bounds[n_prompts] :]])
    return PackedLayout(
        ids=torch.tensor(flat.tokens + [0] * extra, device=device)[None],
        pos=F.pad(pos, (0, extra)).to(device)[None],
        mask=mask.to(device)[None, None],
        src=src.to(device),
        row=row.to(device),
        col=col.to(device),
        shared_prompts=n - n_prompts,
        segments=None if segments is None else segments.to(device),
    )


def _segments(
    start: list[int], parent: list[int], length: list[int], pos0: list[int], pad: int
) -> Segments:
    """:class:`Segments` of the packed segments (flat ``start``, ``length``, ``parent``
    prompt or -1, position of the first token ``pos0``); ``pad`` is the padding index."""
    keys, queries, qpos = [], [], []
    for s, (a, m, p0) in enumerate(zip(start, length, pos0, strict=True)):
        own = list(range(a, a + m))
        p = parent[s]
        keys.append((list(range(start[p], start[p] + length[p])) if p >= 0 else []) + own)
        queries.append(own)
        qpos.append(list(range(p0, p0 + m)))
    width = invariant.round_up(max(map(len, keys)), invariant.KEYS)
    q_width = max(map(len, queries))
    return Segments(
        torch.tensor([x + [pad] * (width - len(x)) for x in keys]),
        torch.tensor([x + [pad] * (q_width - len(x)) for x in queries]),
        torch.tensor([x + [-1] * (q_width - len(x)) for x in qpos]),
    )


def packed_hidden(decoder: torch.nn.Module, layout: PackedLayout, n: int, t: int) -> torch.Tensor:
    """Last hidden states (n, T, H) from one packed decoder call. Filled: the position
    before each row's own tokens and its own tokens' positions (the positions that
    predict its own tokens); the shared prompt's earlier positions are 0. The layout's
    segments, if any, reach the attention function (``invariant.sequence_attention``)."""
    extra = {} if layout.segments is None else {"segments": layout.segments}
    h = decoder(
        input_ids=layout.ids,
        attention_mask=layout.mask,
        position_ids=layout.pos,
        use_cache=False,
        **extra,
    ).last_hidden_state[0]  # (T, H)
    out = h.new_zeros(n, t, h.shape[-1])
    return out.index_put((layout.row, layout.col), h[layout.src])

"""Slot KV cache and the model runners the inference engine drives.

A *slot* is one row of the decode batch. The engine admits a request into a
free slot; from then on every step decodes one token for each active slot.
A finished slot is released and refilled with the next pending request at
the next step (continuous batching); the other slots keep their KV cache.

One engine step is **one forward pass** over a flat token axis::

    [ decode token of slot 0 .. slot n-1 | prompt of new request a | prompt of b | ... ]

so weights are read once per step whether the step decodes, prefills newly
admitted prompts, or both (decoding on CPU is bound by reading the weights,
and a separate prefill forward per refill would cost a whole extra step).
Linear layers, norms and RoPE see an ordinary ``(1, T)`` sequence; only
attention needs to know which token belongs to which slot. We register our
own attention function with transformers (:func:`slot_attention`, an sdpa
variant) and pass the step's layout through the decoder layers' ``**kwargs``
(they forward it to the attention function untouched), so the Hugging Face
modules are used as they are. By default the fast runner computes the same layers
with fused projections instead (:mod:`streamrl.engines.inference.fused_layers`), calling the
same slot attention directly; ``fuse_layers=False`` keeps the modules' own forward.

Two runners share one interface (``step``, ``weights_loaded``, ``release``):

- :class:`LlamaSlotRunner` (fast path, Llama family: Llama, SmolLM2, Mistral,
  Qwen2, Qwen3) with the preallocated :class:`SlotKVCache`;
- :class:`~streamrl.engines.inference.fallback_runner.HFCacheRunner` (fallback, any causal LM):
  the model's ordinary forward, batch 1 per slot, each slot with its own Hugging Face
  cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from streamrl.engines import invariant
from streamrl.engines.inference.compile_guards import guards_kept, own_code
from streamrl.engines.inference.fused_layers import FusedDecoder
from streamrl.engines.inference.sampling import sample

# model_type values whose modules follow the Llama layout and calling convention
LLAMA_FAMILY = {"llama", "mistral", "qwen2", "qwen3"}
ATTN_IMPL = "streamrl_slots"


@dataclass
class Prefill:
    """A newly admitted prompt: goes to ``slot``; its first ``shared`` tokens' KV
    is copied from ``source`` (a slot holding the same prefix) instead of computed.
    ``scored`` > 0 asks for the next-token logits of the ``scored`` positions before the
    last one as well (a teacher-forced continuation scored in the prompt's own forward);
    they must be computed, so ``shared`` is at most ``len(prompt) - 1 - scored``."""

    slot: int
    prompt: list[int]
    source: int = -1
    shared: int = 0
    scored: int = 0


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    slot_cache: SlotKVCache | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for engine steps; for any other forward of the model (a trainer or an
    evaluation sharing the model object), the attention it had before an engine took it
    (:data:`OUTSIDE_STEPS`): the batch-invariant trainer's, or plain sdpa.

    query: (1, H, T, D), key/value: (1, H_kv, T, D) -> output (1, T, H, D).
    """
    if slot_cache is None:  # training / reference forwards of the same model object
        if getattr(module, OUTSIDE_STEPS, None) == invariant.ATTN_IMPL:
            return invariant.sequence_attention(
                module, query, key, value, attention_mask, scaling=scaling, **kwargs
            )
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    return slot_cache.attend(module.layer_idx, query, key, value, scaling), None


# attribute of an attention module: the implementation its model had before an engine set
# its own (a module attribute, so the saved config never holds it)
OUTSIDE_STEPS = "_streamrl_outside_steps"


# Not cuDNN's attention: on CUDA it is what sdpa picks for bf16 with a mask, and it costs
# ~0.9 ms of host time per call (an H100, SmolLM2 shape: 874 us x 30 layers per decode
# step, 4x slower than fp32; benchmarks/gpu/profile_engine.py). Flash / memory-efficient
# / math kernels have no such per-call cost; on CPU this changes nothing.
ENGINE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

AttentionInterface.register(ATTN_IMPL, slot_attention)
AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


class SlotKVCache:
    """Per-layer KV buffers written in place, plus the current step's layout.

    keys[l], values[l]: (S, H_kv, C, D) for S slots and capacity C positions.
    Decode rows ``[0:n]`` write their new key at each slot's own position and
    attend over the views ``[:n, :, :kv_len]`` (no gather, no copy) under an
    additive mask that hides what a slot has not written. A new prompt writes
    ``[0:P]`` of its slot and attends causally to itself only; if it shares a
    prefix with a prompt already in another slot (a system prompt, the other
    samples of a GRPO group, earlier turns of a conversation), the prefix KV is
    copied from that slot and only the rest of the prompt is computed.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        batch_invariant: bool = False,
    ) -> None:
        self.num_slots, self.kv_heads, self.head_dim = num_slots, kv_heads, head_dim
        self.num_layers, self.max_len = num_layers, max_len
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0
        # step layout, set by the runner before each forward
        self.n = 0
        self.pos = self.mask = self.flat_idx = None  # (n,), (n, 1, 1, kv_len), (n*H_kv,)
        # (slot, token offset, prompt length, source slot, shared prefix length)
        self.prefills: list[tuple[int, int, int, int, int]] = []
        # (t_new, P) bool, when shared; batch-invariant: invariant.causal_mask (1, M, L)
        self.prefix_masks: list[torch.Tensor | None] = []
        # batch-invariant attention (streamrl.engines.invariant): decode and prefill rows
        # alike, over a multiple of invariant.KEYS keys (the capacity is one)
        self.invariant = batch_invariant
        # decode attention by batched matmuls on CPU (measured faster there), sdpa elsewhere
        self.decode_bmm = self.device.type == "cpu" or batch_invariant
        self.mask_bmm: torch.Tensor | None = None  # (n * H_kv, 1, kv_len), with decode_bmm

    def _decode_bmm(
        self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """Decode attention as two batched matrix products: q (n, H_kv, rep, D) over
        keys/values (n, H_kv, L, D) -> (n, H_kv, rep, D). On CPU this beats sdpa's flash
        kernel at decode shapes (a few query rows per kv head, a short cache)."""
        n, kvh, rep, d = q.shape
        scores = torch.baddbmm(
            self.mask_bmm,
            q.reshape(n * kvh, rep, d),
            keys.flatten(0, 1).transpose(1, 2),
            alpha=d**-0.5 if scale is None else scale,
        )  # (n * H_kv, rep, L)
        return torch.bmm(scores.softmax(-1), vals.flatten(0, 1)).view(n, kvh, rep, d)

    def ensure_capacity(self, length: int) -> bool:
        """Grows the buffers to ``length`` positions (doubling, capped at max_len).

        Growing copies the buffers; it happens O(log max_len) times. Returns True if grown.
        """
        if length <= self.capacity:
            return False
        new = min(self.max_len, max(length, 2 * self.capacity, 64))
        if self.invariant:  # attention runs over whole key blocks
            new = invariant.round_up(max(new, length), invariant.KEYS)
        shape = (self.num_slots, self.kv_heads, new, self.head_dim)
        for store in (self.keys, self.values):
            for i in range(self.num_layers):
                buf = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if i < len(store):
                    buf[:, :, : self.capacity] = store[i]
                    store[i] = buf
                else:
                    store.append(buf)
        self.capacity = new
        return True

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """q: (1, H, T, D); k, v: (1, H_kv, T, D) for the step's flat tokens -> (1, T, H, D)."""
        _, h, t, d = q.shape
        # batch-invariant steps pad the token axis: the padding rows' outputs are zeros
        out = q.new_zeros((t, h, d)) if self.invariant else q.new_empty((t, h, d))
        n = self.n
        if n:
            o = self._attend_decodes(layer, q, k, v, scale)
            if not self.prefills and t == n:  # pure decode step: no staging buffer needed
                return o.reshape(1, n, h, d)
            out[:n] = o.reshape(n, h, d)
        self._attend_prefills(layer, q, k, v, scale, out)
        return out[None]

    def _attend_decodes(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """The decode rows ``[0:n]``: write their keys and values at their slots' next
        positions, then attend over every slot's cache -> (n, H_kv, H / H_kv, D)."""
        _, h, _, d = q.shape
        kvh, n = k.shape[1], self.n
        kbuf, vbuf = self.keys[layer], self.values[layer]
        # decode writes go first: a slot admitted this step may sit inside [0:n]
        # as an idle row writing junk at position 0, which its prefill then overwrites.
        # One index_copy_ per buffer into its (S*H_kv*C, D) view, at the rows
        # self.flat_idx = (slot, head, pos) computed once per step for all layers.
        kbuf.view(-1, d).index_copy_(0, self.flat_idx, k[0, :, :n].transpose(0, 1).reshape(-1, d))
        vbuf.view(-1, d).index_copy_(0, self.flat_idx, v[0, :, :n].transpose(0, 1).reshape(-1, d))
        kv_len = self.mask.shape[-1]
        keys, vals = kbuf[:n, :, :kv_len], vbuf[:n, :, :kv_len]  # views, no copy
        # grouped-query: fold the query heads of one kv head into the query axis
        qd = q[0, :, :n].transpose(0, 1).reshape(n, kvh, h // kvh, d)  # (n, H_kv, rep, D)
        if self.invariant:
            return invariant.attention(
                qd.flatten(0, 1),
                keys.flatten(0, 1),
                vals.flatten(0, 1),
                self.mask_bmm,
                d**-0.5 if scale is None else scale,
            )
        if self.decode_bmm:
            return self._decode_bmm(qd, keys, vals, scale)
        return F.scaled_dot_product_attention(qd, keys, vals, attn_mask=self.mask, scale=scale)

    def _attend_prefills(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        out: torch.Tensor,
    ) -> None:
        """Each prefill: copy the shared prefix's KV from its source slot, write the new
        tokens' KV, and attend causally into ``out``'s rows of its tokens."""
        _, h, _, d = q.shape
        kvh = k.shape[1]
        kbuf, vbuf = self.keys[layer], self.values[layer]
        for (slot, off, p, src, shared), mask in zip(self.prefills, self.prefix_masks, strict=True):
            t_new = p - shared  # tokens computed this step: prompt[shared:p]
            ks, vs = k[:, :, off : off + t_new], v[:, :, off : off + t_new]  # (1, H_kv, t_new, D)
            if shared:  # reuse another slot's KV of the common prefix (same tokens, same positions)
                kbuf[slot, :, :shared] = kbuf[src, :, :shared]
                vbuf[slot, :, :shared] = vbuf[src, :, :shared]
            kbuf[slot, :, shared:p] = ks[0]
            vbuf[slot, :, shared:p] = vs[0]
            if self.invariant:
                out[off : off + t_new] = invariant.prefill_attention(
                    q[0, :, off : off + t_new],
                    kbuf[slot],
                    vbuf[slot],
                    mask,
                    d**-0.5 if scale is None else scale,
                )
                continue
            qs = q[:, :, off : off + t_new]
            gqa = kvh != h
            if shared:  # causal, aligned to the end: query i sees keys [0, shared + i]
                kk, vv = kbuf[slot : slot + 1, :, :p], vbuf[slot : slot + 1, :, :p]
                o = F.scaled_dot_product_attention(
                    qs, kk, vv, attn_mask=mask, scale=scale, enable_gqa=gqa
                )
            else:
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
                )
            out[off : off + t_new] = o[0].transpose(0, 1)  # (t_new, H, D)


def supports_fast_path(model: torch.nn.Module, max_seq_len: int) -> bool:
    """True when ``model`` can be driven module by module by :class:`LlamaSlotRunner`."""
    cfg = model.config
    inner = getattr(model, "model", None)
    if cfg.model_type not in LLAMA_FAMILY or inner is None or not hasattr(model, "lm_head"):
        return False
    if not all(hasattr(inner, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    # our attention is full causal: sliding-window layers need the fallback
    # unless the window can never bind
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    uses_window = cfg.model_type == "mistral" or "sliding_attention" in layer_types
    return not (uses_window and window is not None and window < max_seq_len)


def _take_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` to the runner's attention; each layer remembers the one it had,
    so the model's other forwards (outside the runner's steps) keep it."""
    before = getattr(model.config, "_attn_implementation", None)
    for layer in model.model.layers:  # other forwards of this model keep their attention
        if before != ATTN_IMPL:
            setattr(layer.self_attn, OUTSIDE_STEPS, before)
    set_attn_impl(model, ATTN_IMPL)


class LlamaSlotRunner:
    """One fused decode+prefill forward per step for Llama-family models.

    Per slot it keeps the KV length ``lens`` (where the next token goes),
    ``active`` (1 while the slot decodes) and one row of the additive attention
    mask (0 = visible, dtype-min = hidden), all updated incrementally: a prefill
    opens ``[0:P]``, each decode step one more position. A free slot has length
    0 and only position 0 visible, so idle rows inside ``[0:n]`` stay finite
    (their outputs are never read and they never advance).

    The longest active length is needed on the host to size the key window.
    Instead of syncing ``lens``, each active slot stores ``base = length -
    steps`` so its length is ``base + steps`` for the step counter ``steps``.
    """

    _IDLE = -(1 << 62)
    shares_prefixes = True

    def __init__(
        self,
        model: torch.nn.Module,
        num_slots: int,
        max_seq_len: int,
        fuse: bool = False,
        packed: str = "",  # the engine weights' packing, "" for plain fp32
        compile_decode: bool = False,
        batch_invariant: bool = False,
    ) -> None:
        if compile_decode and batch_invariant:
            raise ValueError(
                "compile_decode cannot be batch-invariant: its graphs reduce in their own order"
            )
        _take_attention(model)
        inner, cfg = model.model, model.config
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, inner.norm
        self.layers = list(inner.layers[: cfg.num_hidden_layers])
        self.lm_head = model.lm_head
        # fuse: the caller checked supports_fused (LocalEngine decides, and packs to match)
        self.fused = FusedDecoder(model, packed) if fuse else None
        if self.fused is not None:
            self.fused.rope_as_model = batch_invariant
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.heads_per_kv = cfg.num_attention_heads // kv_heads
        # batch-invariant numerics (streamrl.engines.invariant): padded rows and keys
        self.invariant = batch_invariant
        self.cache = SlotKVCache(
            len(self.layers),
            num_slots,
            kv_heads,
            head_dim,
            max_seq_len,
            self.dtype,
            self.device,
            batch_invariant,
        )
        self.neg = torch.finfo(self.dtype).min
        self.mask = torch.empty((num_slots, 1, 1, 0), dtype=self.dtype, device=self.device)
        self.lens = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.active = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.slot_ids = torch.arange(num_slots, device=self.device)
        self.kv_heads, self.heads = kv_heads, torch.arange(kv_heads, device=self.device)
        self.base = [self._IDLE] * num_slots
        self.steps = 0
        # the backend choice matters on CUDA only (see ENGINE_SDPA_BACKENDS); entering it
        # costs ~30 us a step, which a small model's CPU step notices
        cuda = self.device.type == "cuda"
        self._sdpa = (lambda: sdpa_kernel(ENGINE_SDPA_BACKENDS)) if cuda else nullcontext
        self.compiled = self._compile_decode() if compile_decode else None

    def _compile_decode(self) -> Callable[..., Any]:
        """The compiled pure-decode step (``compile_decode``), from the plan to the tokens."""
        if self.fused is None:
            raise ValueError("compile_decode needs the fused decoder layers (fuse=True)")
        # A step that only decodes runs every slot (idle ones too) over the whole cache
        # capacity through a compiled graph, so its shapes are static: one graph per
        # capacity, which doubles, so a handful per engine. The graph takes the step
        # from the plan to the drawn tokens (decode_all). The guards kept are the
        # input tensors' (which capacity) and torch's global state; the others are
        # invariants of this runner: the same modules (weights are updated in place),
        # the same step plan (decode rows 0..S-1, no prefill). Python-side guards on
        # all of that took 0.2-0.3 ms a step. The graphs are this runner's own (its
        # own code object), so another engine in the process never runs them.
        # cpp_wrapper: the kernels are called from C++, not from a Python wrapper.
        return torch.compile(
            own_code(self._decode_all),
            dynamic=False,
            fullgraph=True,
            options={"cpp_wrapper": True, "guard_filter_fn": guards_kept},
        )

    def _ensure_capacity(self, length: int) -> None:
        old = self.cache.capacity
        if self.cache.ensure_capacity(length):
            mask = torch.full(
                (self.mask.shape[0], 1, 1, self.cache.capacity),
                self.neg,
                dtype=self.dtype,
                device=self.device,
            )
            mask[..., :old] = self.mask
            if old == 0:
                mask[..., 0] = 0.0
            self.mask = mask

    def step(
        self, decode_slots: list[int], tokens: torch.Tensor, prefills: list[Prefill]
    ) -> torch.Tensor:
        """Decodes ``decode_slots`` and prefills ``prefills`` in one forward.

        decode_slots: active slots, ascending; their last token is ``tokens[slot]``
        tokens:       (S,) long, last sampled token of every slot
        prefills:     newly admitted requests, in admission order (a prefix source
                      admitted in the same step comes first)
        returns:      (len(decode_slots) + len(prefills) + sum(scored), V) float32
                      next-token logits: decode rows first, then one row per prompt (its
                      last position), then each prompt's ``scored`` rows, in order
        """
        n = decode_slots[-1] + 1 if decode_slots else 0
        ids, pos, last, scored = self._layout(n, tokens, prefills)
        sampled = decode_slots + last + scored
        if self.invariant:  # the head on a multiple of ROWS rows (row 0 again)
            sampled += [0] * (invariant.round_up(len(sampled), invariant.ROWS) - len(sampled))
        rows = torch.tensor(sampled, device=self.device)
        with self._sdpa():  # the head on the sampled rows only
            logits = self._logits(ids, pos, rows)
        self._advance(n, prefills)
        return logits[: len(decode_slots) + len(last) + len(scored)]

    def decode_all(
        self, tokens: torch.Tensor, uniforms: torch.Tensor, greedy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step that only decodes, as one compiled graph (``compile_decode``): every slot
        decodes over the cache's whole capacity, then draws its next token by
        :func:`sample` (the engine's draw for a row sampled from softmax(logits) or
        greedily; the caller samples other rows again from the logits).

        tokens, uniforms, greedy: (S,) last token, uniform and greedy flag of every slot
        returns: (S, V) float32 logits, (S,) drawn tokens, (S,) their log-probs
        """
        c = self.cache
        self._ensure_capacity(self._kv_len(c.num_slots))
        c.n, c.prefills, c.prefix_masks = c.num_slots, [], []
        out = self.compiled(tokens, uniforms, greedy)
        self.steps += 1
        return out

    def _decode_all(
        self, tokens: torch.Tensor, uniforms: torch.Tensor, greedy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """decode_all's graph: plan, decoder, head, draw, and every active slot grows by one."""
        c = self.cache
        self._decode_layout(c.num_slots, c.capacity)
        logits = self._logits(tokens[None], c.pos[None])
        drawn, logprobs = sample(logits, greedy, uniforms, traced=True)
        self.lens.add_(self.active)
        c.pos = c.flat_idx = c.mask = c.mask_bmm = None  # the plan lives in the graph only
        return logits, drawn, logprobs

    def _logits(
        self, ids: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 next-token logits (len(rows), V) of the flat tokens' ``rows`` (all: None)."""
        h = self._hidden(ids, pos)
        return self.lm_head(self.norm(h if rows is None else h[rows])).float()

    def _hidden(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The decoder over the step's flat tokens: ids, pos (1, T) -> (T, E), before the
        final norm (the cache's step plan is already set)."""
        h = self.embed(ids)  # (1, T, E)
        pe = self.rotary(h, pos)  # (cos, sin), each (1, T, D), shared by all layers
        if self.fused is not None:
            cos, sin = self.fused.rope_tables(*pe)
            return self.fused.forward(h[0], cos, sin, self.cache.attend)
        for layer in self.layers:  # the model's own layer modules
            h = layer(
                h,
                attention_mask=None,
                position_ids=pos,
                position_embeddings=pe,
                slot_cache=self.cache,
            )
            if isinstance(h, tuple):  # older transformers return (hidden, ...)
                h = h[0]
        return h[0]

    def _kv_len(self, n: int) -> int:
        """Keys decode rows [0:n] attend over: the longest active length, plus the new one
        (batch-invariant: rounded up to whole key blocks)."""
        kv_len = max(max(self.base[:n], default=self._IDLE) + self.steps, 0) + 1
        return invariant.round_up(kv_len, invariant.KEYS) if self.invariant else kv_len

    def _layout(
        self, n: int, tokens: torch.Tensor, prefills: list[Prefill]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
        """Sets the cache's step plan; returns flat ids (1, T), positions (1, T), the
        flat index of each prompt's last computed token, and those of its scored ones."""
        kv_len = self._kv_len(n)
        self._ensure_capacity(max([kv_len] + [len(f.prompt) + 1 for f in prefills]))
        c = self.cache
        c.n, c.prefills, c.prefix_masks = n, [], []
        ids, pos = [], []
        if n:
            self._decode_layout(n, kv_len)
            ids.append(tokens[:n])
            pos.append(c.pos)
        off, flat_ids, flat_pos, last, scored = n, [], [], [], []
        for f in prefills:
            p, shared = len(f.prompt), f.shared
            if shared > p - 1 - f.scored:
                raise ValueError(f"a scored prefill shares {shared} of its {p} tokens")
            c.prefills.append((f.slot, off, p, f.source, shared))
            if self.invariant:  # the same for every layer: built once a step
                rep = self.heads_per_kv
                c.prefix_masks.append(
                    invariant.causal_mask(shared, p - shared, rep, self.dtype, self.device)
                )
            elif shared:
                mask = torch.ones((p - shared, p), dtype=torch.bool).tril(shared)
                c.prefix_masks.append(mask.to(self.device))
            else:
                c.prefix_masks.append(None)
            flat_ids += f.prompt[shared:]
            flat_pos += range(shared, p)
            off += p - shared
            last.append(off - 1)
            scored += range(off - 1 - f.scored, off - 1)
        if self.invariant:  # every product on a multiple of ROWS rows: pad with token 0
            pad = invariant.round_up(off, invariant.ROWS) - off
            flat_ids += [0] * pad
            flat_pos += [0] * pad
        if flat_ids:
            ids.append(torch.tensor(flat_ids, dtype=torch.long).to(self.device))
            pos.append(torch.tensor(flat_pos, dtype=torch.long).to(self.device))
        return torch.cat(ids)[None], torch.cat(pos)[None], last, scored

    def _decode_layout(self, n: int, kv_len: int) -> None:
        """The plan of decode rows [0:n]: each slot writes its new key at its own length and
        attends over keys [0:kv_len]."""
        c = self.cache
        c.pos = self.lens[:n]
        self.mask[self.slot_ids[:n], 0, 0, c.pos] = 0.0  # each slot now sees its new key
        # row of (slot, head, pos) in a (S*H_kv*C, D) view of a KV buffer: (n*H_kv,)
        slot_head = self.slot_ids[:n, None] * self.kv_heads + self.heads  # (n, H_kv)
        c.flat_idx = (slot_head * c.capacity + c.pos[:, None]).reshape(-1)
        c.mask = self.mask[:n, :, :, :kv_len]
        if c.decode_bmm:  # the mask of every (slot, kv head), as one batch of products
            c.mask_bmm = c.mask.expand(n, self.kv_heads, 1, -1).reshape(n * self.kv_heads, 1, -1)

    def _advance(self, n: int, prefills: list[Prefill]) -> None:
        """After the forward: decoding slots grew by one, new slots hold their prompt."""
        if n:
            self.lens[:n] += self.active[:n]
        self.steps += 1
        if not prefills:
            return
        slot_t = torch.tensor([f.slot for f in prefills], device=self.device)
        lengths = torch.tensor([len(f.prompt) for f in prefills], device=self.device)
        cap = torch.arange(self.cache.capacity, device=self.device)
        opened = torch.where(cap[None] < lengths[:, None], 0.0, self.neg).to(self.dtype)
        self.mask[slot_t] = opened[:, None, None]  # (m, 1, 1, C): [0:P) visible
        self.lens[slot_t] = lengths
        self.active[slot_t] = 1
        for f in prefills:
            self.base[f.slot] = len(f.prompt) - self.steps

    def weights_loaded(self, names: Iterable[str], executor: Executor | None = None) -> None:
        """Called after the parameters ``names`` were loaded: fused copies follow them
        (packed on ``executor``'s threads when given)."""
        if self.fused is not None:
            self.fused.refresh(names, executor)

    def linear_layers(self) -> list[torch.nn.Module]:
        """Every linear layer one step runs (the vocabulary head included)."""
        if self.fused is None:
            own = [m for layer in self.layers for m in layer.modules() if isinstance(m, nn.Linear)]
            return [*own, self.lm_head]
        return [*self.fused.linear_layers(), self.lm_head]

    def release(self, slot: int) -> None:
        self.lens[slot] = 0
        self.active[slot] = 0
        self.base[slot] = self._IDLE
        self.mask[slot] = self.neg
        self.mask[slot, ..., 0] = 0.0


def set_attn_impl(model: torch.nn.Module, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError, ImportError):
        model.config._attn_implementation = name

"""Which slot lends a newly admitted prompt the KV of its longest shared prefix (a
system prompt, the other samples of a GRPO group, earlier turns of a conversation), so
that only the rest of the prompt is computed (``kv_cache.Prefill``)."""

from __future__ import annotations

from streamrl.engines.inference.kv_cache import Prefill


def plan_prefills(
    known: list[tuple[int, list[int]]], admitted: list[tuple[int, list[int], int]]
) -> list[Prefill]:
    """One :class:`Prefill` per admitted ``(slot, prompt, scored)``, in order.

    ``known``: ``(slot, tokens)`` whose KV the step holds before it computes anything
    (the decoding slots' prompt and generated tokens, but their last one, whose KV the
    step itself writes). Each admitted prompt may also share the prompts admitted
    before it. At least one prompt token, and every scored one, is always computed:
    their logits are read."""
    known = list(known)
    plans = []
    for slot, prompt, scored in admitted:
        best, src = 0, -1
        for other, toks in known:
            if toks and toks[0] == prompt[0]:
                shared = common_prefix_len(prompt, toks)
                if shared > best:
                    best, src = shared, other
        plans.append(Prefill(slot, prompt, src, min(best, len(prompt) - 1 - scored), scored))
        known.append((slot, prompt))
    return plans


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # fast path (C comparison): one is a prefix of the other
        return n
    lo, hi = 0, n  # binary search on list-slice equality: O(n log n) in C, not a Python loop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo

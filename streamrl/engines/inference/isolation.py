"""One request fails alone: what the built-in engine checks before a request joins a
batch (whose forward it would fail for everyone), and how a step's per-request work is
run again request by request when it fails, so that only the requests that fail alone
fail (docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from streamrl.core.types import GenerationRequest
from streamrl.engines.inference.sampling import check_params

T = TypeVar("T")
R = TypeVar("R")
_INTS = (int, np.integer)  # what a token id may be


def check_request(req: GenerationRequest, vocab: int, tokenizer: Any) -> None:
    """Raises ValueError for a request the engine cannot serve: token ids outside
    [0, ``vocab``), sampling parameters the sampler cannot take, stop strings without
    a tokenizer."""
    if not req.prompt_ids:
        raise ValueError("GenerationRequest.prompt_ids is empty; need at least one token")
    for name, ids in (("prompt_ids", req.prompt_ids), ("forced_ids", req.forced_ids or [])):
        bad = next((t for t in ids if not isinstance(t, _INTS) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"{name} holds {bad!r}: token ids are integers in [0, {vocab})")
    p = req.params
    check_params(p.temperature, p.top_k, p.top_p)
    if not isinstance(p.max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer, got {p.max_new_tokens!r}")
    if p.stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer: LocalEngine(model, tokenizer)")


def each_alone(
    run: Callable[[list[T]], list[R]], items: list[T]
) -> tuple[list[R | None], dict[int, Exception]]:
    """``run(items)``, one result per item; if it raises, ``run([item])`` for every item
    alone. Returns the results (None for an item that failed alone) and those failures,
    by index. An item's result must depend on that item alone (the engine's rows do), so
    the others get what one run would have given them."""
    try:
        return list(run(items)), {}
    except Exception:
        pass
    results: list[R | None] = []
    failed: dict[int, Exception] = {}
    for i, item in enumerate(items):
        try:
            results += run([item])
        except Exception as exc:
            results.append(None)
            failed[i] = exc
    return results, failed

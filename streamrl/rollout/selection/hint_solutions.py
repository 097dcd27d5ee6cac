"""Reference solutions a hint is cut from, and the hint's rendering on a rollout worker.

An item's reference solution, in this order: a worked solution its source put in
``metadata["solution"]``; for an arithmetic item (``metadata["operands"]``,
``["operators"]``), a worked solution computed step by step (``*`` first, then left to
right); otherwise its reference answer (``item.answer``: reasoning-gym's final answers).
An item with none gets no hint (counted by the sampler, never faked).

>>> from streamrl.core.types import Item
>>> arithmetic_solution([3, 4, 5], ["+", "*"])
'4*5=20, 3+20=23'
>>> reference_solution(Item(id="q", prompt="?", answer="cat, dog"))
'cat, dog'
>>> reference_solution(Item(id="q", prompt="?")) is None
True
"""

from __future__ import annotations

import copy
import math
from typing import Any

from streamrl.core.types import HINT_KEY, Item
from streamrl.sources.arithmetic import evaluate


def arithmetic_solution(operands: list[int], operators: list[str]) -> str:
    """The worked solution of ``operands`` joined by ``operators``: each product first,
    then the sums left to right, one ``a op b=c`` step each; its last number is the answer."""
    values, ops, steps = list(operands), list(operators), []
    for wanted in (("*",), ("+", "-")):
        i = 0
        while i < len(ops):
            if ops[i] in wanted:
                a, op, b = values[i], ops[i], values[i + 1]
                c = evaluate([a, b], [op])
                steps.append(f"{a}{op}{b}={c}")
                values[i : i + 2] = [c]
                del ops[i]
            else:
                i += 1
    return ", ".join(steps) if steps else str(values[0])


def reference_solution(item: Item) -> str | None:
    """``item``'s reference solution (see the module docstring), or None."""
    meta = item.metadata
    if isinstance(meta.get("solution"), str) and meta["solution"]:
        return meta["solution"]
    if "operands" in meta and "operators" in meta:
        return arithmetic_solution(list(meta["operands"]), list(meta["operators"]))
    return item.answer if item.answer else None


def hint_ids(tokenizer: Any, solution: str, fraction: float) -> list[int]:
    """The first ``ceil(fraction * n)`` of the solution's n tokens (at least one)."""
    ids = tokenizer.encode(solution, add_special_tokens=False)
    return ids[: max(1, math.ceil(fraction * len(ids)))]


def render_hint(item: Item, tokenizer: Any, template: str) -> Item:
    """A copy of hinted ``item`` with its hint cut to its fraction: in prefix mode the
    tokens the episode forces (``prefix_ids``), in prompt mode the prompt (or the last user
    message) rewritten with ``template``; the hint's ``text`` and ``tokens`` recorded."""
    hint = dict(item.metadata[HINT_KEY])
    ids = hint_ids(tokenizer, hint["solution"], hint["fraction"])
    text = tokenizer.decode(ids)
    hint.update(text=text, tokens=len(ids))
    out = copy.copy(item)
    if hint["mode"] == "prefix":
        hint["prefix_ids"] = ids
    elif item.messages is not None:
        messages = [dict(m) for m in item.messages]
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last]["content"] = template.format(prompt=messages[last]["content"], hint=text)
        out.messages = messages
    else:
        out.prompt = template.format(prompt=item.prompt, hint=text)
    out.metadata = {**item.metadata, HINT_KEY: hint}
    return out

"""A long-tail generation workload: some prompts get a much larger answer budget.

RL rollouts have long-tailed lengths: a few completions run far longer than the
rest, and a rollout phase that waits for its longest member leaves the engine
nearly empty at the end. This source reproduces that shape on arithmetic items:
a ``long_fraction`` of them (chosen by a stable hash of the item id, so the
choice does not depend on order or seed) carry ``metadata["max_new_tokens"] =
long_tokens``, the rest ``short_tokens``. Episodes honour that per-item budget;
with ``rollout.ignore_eos=true`` every completion uses all of it, which makes the
lengths exact (as vLLM's throughput benchmarks do with fixed output lengths).
"""

from __future__ import annotations

from streamrl.core.types import Item
from streamrl.sources.arithmetic import ArithmeticTaskSource
from streamrl.sources.base import stable_hash


class LongTailTaskSource(ArithmeticTaskSource):
    """Arithmetic items, ``long_fraction`` of them with a ``long_tokens`` budget (the
    other options are the arithmetic source's).

    >>> src = LongTailTaskSource(long_fraction=0.5, short_tokens=4, long_tokens=32)
    >>> sorted({it.metadata["max_new_tokens"] for it in src.heldout(20)})
    [4, 32]
    """

    task_name = "longtail"

    def __init__(
        self,
        long_fraction: float = 0.125,
        short_tokens: int = 16,
        long_tokens: int = 128,
        **arithmetic_options,
    ) -> None:
        if not 0.0 <= long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be in [0, 1], got {long_fraction}")
        if not 1 <= short_tokens <= long_tokens:
            raise ValueError("need 1 <= short_tokens <= long_tokens")
        super().__init__(**arithmetic_options)
        self.long_fraction = long_fraction
        self.short_tokens, self.long_tokens = short_tokens, long_tokens

    def make_item(self, operands: list[int], operators: list[str]) -> Item:
        item = super().make_item(operands, operators)
        is_long = stable_hash("longtail:" + item.id) % 10_000 < self.long_fraction * 10_000
        item.metadata["max_new_tokens"] = self.long_tokens if is_long else self.short_tokens
        return item

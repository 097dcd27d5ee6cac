"""The inference engine's fallback runner, for any causal LM: the model's ordinary
forward, batch 1 per slot, each slot with its own Hugging Face cache. Same interface as
:class:`~streamrl.engines.inference.kv_cache.LlamaSlotRunner` (``step``, ``weights_loaded``,
``release``). Every slot computes alone, so its numbers never depend on the others."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

import torch

from streamrl.engines.inference.kv_cache import Prefill


class HFCacheRunner:
    """Fallback for any causal LM: ordinary forward, batch 1 per slot, own HF cache each.

    Correct for every architecture (sliding windows, learned positions, ...) at
    the price of one forward call per sequence per step.
    """

    def __init__(self, model: torch.nn.Module, num_slots: int, max_seq_len: int) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.caches: list[Any] = [None] * num_slots

    def _run(self, ids: list[int], cache: Any, rows: int = 1) -> tuple[torch.Tensor, Any]:
        """The next-token logits of the last ``rows`` positions (rows, V), and the cache."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True)
        return out.logits[0, -rows:].float(), out.past_key_values

    shares_prefixes = False

    def step(
        self, decode_slots: list[int], tokens: torch.Tensor, prefills: list[Prefill]
    ) -> torch.Tensor:
        """Same contract as :meth:`LlamaSlotRunner.step` (prefix sharing not supported)."""
        rows, scored = [], []
        last = tokens.tolist()
        for s in decode_slots:
            logits, self.caches[s] = self._run([last[s]], self.caches[s])
            rows.append(logits)
        for f in prefills:
            logits, self.caches[f.slot] = self._run(f.prompt, None, 1 + f.scored)
            rows.append(logits[-1:])
            scored.append(logits[:-1])
        return torch.cat(rows + scored)

    def weights_loaded(self, names: Iterable[str], executor: Executor | None = None) -> None:
        pass

    def release(self, slot: int) -> None:
        self.caches[slot] = None

"""Any reasoning-gym task as a task source (procedural, nothing is downloaded).

Training and held-out come from two reasoning-gym datasets of the same task built
with different seeds. Training entries whose question text also occurs in the
held-out set are dropped, so the splits never share a question. Each item keeps the
original entry in ``metadata["rg_entry"]`` and the task name in
``metadata["rg_task"]``; the ``reasoning_gym`` reward scores with the task's own
``score_answer(answer, entry)``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any, Literal

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource

# Held-out entries come from seed + this offset (train uses ``seed``).
HELDOUT_SEED_OFFSET = 1_000_003


class ReasoningGymTaskSource(TaskSource):
    """Items from ``reasoning_gym.create_dataset(task, size=..., seed=..., **config)``.

    Args:
        task: a registered reasoning-gym dataset name, e.g. ``"leg_counting"``.
        size: number of distinct training entries (cycled, reshuffled every epoch).
        seed: dataset seed of the training entries (held-out uses
            ``seed + HELDOUT_SEED_OFFSET`` unless ``heldout_seed`` is given).
        heldout_size: number of held-out entries.
        format: ``"plain"`` (the question as ``prompt``) or ``"chat"`` (one user
            message, preceded by ``system_prompt`` when given).
        config: extra options for the task's config dataclass (e.g. difficulty).
    """

    def __init__(
        self,
        task: str,
        size: int = 10_000,
        seed: int = 0,
        heldout_size: int = 200,
        heldout_seed: int | None = None,
        format: Literal["plain", "chat"] = "plain",
        system_prompt: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        if format not in ("plain", "chat"):
            raise ValueError(f"format must be 'plain' or 'chat', got {format!r}")
        if size < 1 or heldout_size < 0:
            raise ValueError(f"need size >= 1 and heldout_size >= 0, got {size}, {heldout_size}")
        self.task, self.format, self.system_prompt = task, format, system_prompt
        hseed = seed + HELDOUT_SEED_OFFSET if heldout_seed is None else heldout_seed
        if hseed == seed:
            raise ValueError("heldout_seed must differ from seed")
        self._train_ds = _create(task, size, seed, config or {})
        heldout_ds = _create(task, heldout_size, hseed, config or {}) if heldout_size else []
        self._heldout_entries = list(heldout_ds)
        self._heldout_questions = {e["question"] for e in self._heldout_entries}
        # Training indices skipped because their question is held out (filled as met).
        self.dropped_overlap: set[int] = set()

    def _item(self, entry: dict[str, Any], split: str, index: int) -> Item:
        question = entry["question"]
        if self.format == "plain":
            prompt, messages = question, None
        else:
            prompt, messages = None, [{"role": "user", "content": question}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
        return Item(
            id=f"rg:{self.task}:{split}:{index}",
            prompt=prompt,
            messages=messages,
            answer=None if entry.get("answer") is None else str(entry["answer"]),
            metadata={"rg_task": self.task, "rg_entry": entry},
        )

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        order = list(range(len(self._train_ds)))
        while True:
            rng.shuffle(order)
            yielded = False
            for i in order:
                entry = self._train_ds[i]  # generated on access, deterministic per index
                if entry["question"] in self._heldout_questions:
                    self.dropped_overlap.add(i)
                    continue
                yielded = True
                yield self._item(entry, "train", i)
            if not yielded:
                raise ValueError(f"reasoning_gym {self.task}: every training entry is held out")

    def heldout(self, n: int | None = None) -> list[Item]:
        entries = self._heldout_entries if n is None else self._heldout_entries[:n]
        return [self._item(copy.deepcopy(e), "heldout", i) for i, e in enumerate(entries)]


def _create(task: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **config)
    except (ValueError, TypeError) as e:
        raise ValueError(f"reasoning_gym task {task!r}: {e}") from e

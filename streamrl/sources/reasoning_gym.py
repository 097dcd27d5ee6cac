"""Any reasoning-gym task as a task source (procedural, nothing is downloaded).

Training and held-out come from two reasoning-gym datasets of the same task built
with different seeds. Training entries whose question text also occurs in the
held-out set are dropped, so the splits never share a question. Each item keeps the
original entry in ``metadata["rg_entry"]`` and the task name in
``metadata["rg_task"]``; the ``reasoning_gym`` reward scores with the task's own
``score_answer(answer, entry)``.

Difficulty: a task with a reasoning-gym curriculum has that curriculum's levels
(its global level: every attribute at level L, or its last); level L draws training
entries from the configuration the curriculum generates at L over the ``config``
given. The held-out split stays the task as configured.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Iterator
from typing import Any, Literal

from streamrl.core.types import Item
from streamrl.sources.base import LEVEL_KEY, TaskSource

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
        self.task_name, self.size, self.seed, self.config = task, size, seed, config or {}
        hseed = seed + HELDOUT_SEED_OFFSET if heldout_seed is None else heldout_seed
        if hseed == seed:
            raise ValueError("heldout_seed must differ from seed")
        self._train_ds = _create(task, size, seed, config or {})
        heldout_ds = _create(task, heldout_size, hseed, config or {}) if heldout_size else []
        self._heldout_entries = list(heldout_ds)
        self._heldout_questions = {e["question"] for e in self._heldout_entries}
        # Training indices skipped because their question is held out (filled as met).
        self.dropped_overlap: set[int] = set()

    @property
    def levels(self) -> int:
        """The task's reasoning-gym curriculum's levels (1 without a curriculum)."""
        curriculum = _curriculum(self.task)
        if curriculum is None:
            return 1
        return max((len(a.levels) for a in curriculum.attributes.values()), default=1)

    def set_level(self, level: int) -> None:
        """Training entries from the curriculum's configuration at ``level``."""
        super().set_level(level)
        curriculum = _curriculum(self.task)
        if curriculum is None:
            return
        curriculum.set_global_level(level)
        generated = dataclasses.asdict(curriculum.generate_configuration(dict(self.config)))
        options = {k: v for k, v in generated.items() if k not in ("seed", "size")}
        self._train_ds = _create(self.task, self.size, self.seed, options)
        self.dropped_overlap = set()

    def _item(self, entry: dict[str, Any], split: str, index: int) -> Item:
        question = entry["question"]
        if self.format == "plain":
            prompt, messages = question, None
        else:
            prompt, messages = None, [{"role": "user", "content": question}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
        level = self.level if split == "train" else None
        metadata: dict[str, Any] = {"rg_task": self.task, "rg_entry": entry}
        if level is not None:
            metadata[LEVEL_KEY] = level
        return Item(
            id=f"rg:{self.task}:{split}:{index}" + ("" if level is None else f":L{level}"),
            prompt=prompt,
            messages=messages,
            answer=None if entry.get("answer") is None else str(entry["answer"]),
            metadata=metadata,
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


def _curriculum(task: str) -> Any:
    """The task's reasoning-gym curriculum, or None where it has none."""
    from reasoning_gym.factory import create_curriculum, has_curriculum

    return create_curriculum(task) if has_curriculum(task) else None


def _create(task: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **config)
    except (ValueError, TypeError) as e:
        raise ValueError(f"reasoning_gym task {task!r}: {e}") from e

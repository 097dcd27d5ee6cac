"""A mixture of task sources: several domains in one run.

``data.kind=mixture`` with ``data.options.sources``, a list of
``{name, kind, options, weight, correct_reward}`` (``options`` default ``{}``,
``weight`` default 1, ``correct_reward`` optional). Every item is tagged
``metadata["domain"] = name`` (and ``metadata["correct_reward"]`` when given: the
reward whose value >= 1 counts as correct on that domain, instead of
``reward.correct_reward``); its id is prefixed ``name/`` so ids stay unique.
Reward components with ``domains`` score only their domains' items, and evaluation
reports ``accuracy/<domain>``.

Training draws the next source by weight from ``random.Random(seed)``, and source
``k`` (0-based) yields from its own ``train_iter(seed + k)``: the stream is a function
of the seed. ``heldout(n)`` takes from each source, in order, its share
``n * weight / sum(weights)`` (rounded so the shares add up to ``n``, at least one
each; all of each source's held-out items when ``n`` is None).

>>> src = MixtureTaskSource([
...     {"name": "add", "kind": "arithmetic", "options": {"operators": "+"}, "weight": 3},
...     {"name": "mul", "kind": "arithmetic", "options": {"operators": "*"},
...      "correct_reward": "exact_match"},
... ])
>>> [(it.id.split("/")[0], item_correct_reward(it, "numeric_match")) for it in src.heldout(4)]
[('add', 'numeric_match'), ('add', 'numeric_match'), ('add', 'numeric_match'), ('mul', 'exact_match')]
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from streamrl.config.options import OptionsError
from streamrl.core.types import Item
from streamrl.sources.base import DataError, Task, TaskSource

DOMAIN_KEY = "domain"  # item.metadata key: the mixture source an item came from
CORRECT_REWARD_KEY = "correct_reward"  # item.metadata key: its domain's correctness reward


class Tagged(Protocol):
    """An item, or a sample of one (Trajectory, Segment, Transitions): its metadata
    carries the item's domain and correctness reward."""

    metadata: dict[str, Any]


_SPEC_KEYS = ("name", "kind", "options", "weight", "correct_reward")
_WHERE = "data.options.sources"


def item_domain(item: Tagged | None) -> str | None:
    """The item's domain (``metadata["domain"]``), or None for an item of no mixture.

    >>> item_domain(Item(id="q", prompt="?", metadata={"domain": "math"}))
    'math'
    """
    metadata = (item.metadata if item is not None else None) or {}
    return metadata.get(DOMAIN_KEY)


def item_correct_reward(item: Tagged | None, default: str) -> str:
    """The reward that decides whether an answer to ``item`` is correct: its
    ``metadata["correct_reward"]`` when set, else ``default`` (``reward.correct_reward``).

    >>> item_correct_reward(Item(id="q", prompt="?"), "numeric_match")
    'numeric_match'
    """
    metadata = (item.metadata if item is not None else None) or {}
    return metadata.get(CORRECT_REWARD_KEY) or default


@dataclass
class _Part:
    name: str
    source: TaskSource
    weight: float
    correct_reward: str | None

    def tag(self, item: Item) -> Item:
        item.id = f"{self.name}/{item.id}"
        item.metadata[DOMAIN_KEY] = self.name
        if self.correct_reward is not None:
            item.metadata[CORRECT_REWARD_KEY] = self.correct_reward
        return item


def _error(i: int, key: str, message: str) -> DataError:
    return DataError(f"{_WHERE}[{i}].{key}", message)


def _part(i: int, spec: Any, names: set[str]) -> _Part:
    from streamrl.sources import make_task_source, task_source_kinds  # (it registers us)

    if not isinstance(spec, dict):
        raise DataError(f"{_WHERE}[{i}]", f"expected a mapping {{{', '.join(_SPEC_KEYS)}}}")
    if unknown := sorted(set(spec) - set(_SPEC_KEYS)):
        raise _error(i, unknown[0], f"unknown key; known: {', '.join(_SPEC_KEYS)}")
    name = spec.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise _error(i, "name", f"expected a non-empty name without '/', got {name!r}")
    if name in names:
        raise _error(i, "name", f"duplicate source name {name!r}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in task_source_kinds():
        raise _error(i, "kind", f"unknown kind {kind!r}; known: {', '.join(task_source_kinds())}")
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise _error(i, "weight", f"expected a number > 0, got {weight!r}")
    if not math.isfinite(weight):
        raise _error(i, "weight", f"expected a finite number, got {weight!r}")
    correct = spec.get("correct_reward")
    if correct is not None and (not isinstance(correct, str) or not correct):
        raise _error(i, "correct_reward", f"expected a reward name, got {correct!r}")
    options = spec.get("options") or {}
    if not isinstance(options, dict):
        raise _error(i, "options", f"expected a mapping, got {type(options).__name__}")
    where = ("data", "options", "sources", str(i), "options")
    try:
        source = make_task_source(kind, options, where)
    except (OptionsError, DataError):  # (they name the key, or the file and line)
        raise
    except (ValueError, TypeError, OSError) as e:  # unreadable files, ...
        raise _error(i, "options", str(e)) from e
    return _Part(name, source, float(weight), correct)


class MixtureTaskSource(TaskSource):
    """Items from several task sources, drawn by weight and tagged with their domain."""

    def __init__(self, sources: list[dict[str, Any]]) -> None:
        if not isinstance(sources, list | tuple) or not sources:
            raise DataError(
                _WHERE, f"expected a non-empty list of {{{', '.join(_SPEC_KEYS)}}}, got {sources!r}"
            )
        self.parts: list[_Part] = []
        for i, spec in enumerate(sources):
            self.parts.append(_part(i, spec, {p.name for p in self.parts}))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def tasks(self) -> list[Task]:
        """Each domain, its weight, its source and its tag (a curriculum steers each)."""
        return [Task(p.name, p.weight, p.source, p.tag) for p in self.parts]

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        streams = [p.source.train_iter(seed + k) for k, p in enumerate(self.parts)]
        weights = [p.weight for p in self.parts]
        indices = range(len(self.parts))
        while True:
            k = rng.choices(indices, weights)[0]
            yield self.parts[k].tag(next(streams[k]))

    def shares(self, n: int) -> list[int]:
        """How many held-out items each source gives to ``heldout(n)``.

        Largest remainders of ``n * weight / sum(weights)``, at least one each:

        >>> MixtureTaskSource([{"name": "a", "kind": "arithmetic", "weight": 3},
        ...                    {"name": "b", "kind": "arithmetic", "weight": 1}]).shares(10)
        [8, 2]
        """
        total = sum(p.weight for p in self.parts)
        quotas = [n * p.weight / total for p in self.parts]
        counts = [max(1, math.floor(q)) for q in quotas]
        by_remainder = sorted(range(len(quotas)), key=lambda k: (counts[k] - quotas[k], k))
        for k in itertools.islice(by_remainder, max(0, n - sum(counts))):
            counts[k] += 1
        return counts

    def heldout(self, n: int | None = None) -> list[Item]:
        if n is not None and n <= 0:
            return []
        counts = [None] * len(self.parts) if n is None else self.shares(n)
        return [
            part.tag(item)
            for part, count in zip(self.parts, counts, strict=True)
            for item in part.source.heldout(count)
        ]

"""The task-source interface, the data error type and helpers shared by all sources.

A task source yields :class:`~streamrl.core.types.Item` s for training (an endless,
seed-deterministic stream) and a fixed held-out list for evaluation, disjoint from
training. Finite sources (files) derive from :class:`FiniteTaskSource`, which
shuffles and cycles epochs; procedural sources implement ``train_iter`` directly.
"""

from __future__ import annotations

import copy
import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.core.types import Item


class DataError(ValueError):
    """A malformed input row, located precisely.

    ``str(err)`` reads ``<source>:<line>: field '<field>': <problem>``, e.g.
    ``data/train.jsonl:3: field 'prompt': expected a string, got int``. ``line`` is the
    1-based line of a JSONL file; for tabular sources (Parquet, ``datasets``) the
    location is written ``row <i>`` with ``i`` the 0-based row index.
    """

    def __init__(
        self,
        source: str,
        message: str,
        *,
        line: int | None = None,
        row: int | None = None,
        field: str | None = None,
    ) -> None:
        self.source, self.message = source, message
        self.line, self.row, self.field = line, row, field
        where = source
        if line is not None:
            where += f":{line}"
        elif row is not None:
            where += f": row {row}"
        what = f"field '{field}': {message}" if field is not None else message
        super().__init__(f"{where}: {what}")


def stable_hash(text: str) -> int:
    """64-bit hash of ``text`` that is the same in every process and Python version.

    (The builtin ``hash`` is salted per process, so it cannot define a split.)

    >>> stable_hash("12+34") == stable_hash("12+34")
    True
    """
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def in_heldout(key: str, fraction: float) -> bool:
    """Whether ``key`` falls in the held-out bucket covering ``fraction`` of hash space."""
    return stable_hash(key) < fraction * 2.0**64


def fresh(item: Item) -> Item:
    """A deep copy, so consumers may mutate ``index``/``metadata`` without aliasing."""
    return copy.deepcopy(item)


LEVEL_KEY = "level"  # item.metadata: the difficulty level a leveled source drew it at


class TaskSource(ABC):
    """Where items come from.

    ``train_iter(seed)`` is infinite and deterministic for a given seed.
    ``heldout(n)`` is the fixed evaluation split (the first ``n`` items, all when
    ``None``): it does not depend on any seed and never overlaps training.
    Each yielded item is a fresh object the caller owns.

    An environment's source also has its Gymnasium spaces (a policy is built for them;
    None for text tasks) and the options its policy needs beyond them, and a source whose training stream comes in phases (offline,
    then online data) says where each ends (:attr:`phases`).

    Difficulty (a curriculum's knob): a procedural source has :attr:`levels` levels of
    its training items, 0 the easiest; :meth:`set_level` picks one for the iterators
    made after it, and each item drawn at a set level records it in
    ``metadata["level"]``. The held-out split stays the task as configured. A source
    with one level has no knob. :meth:`tasks` lists what a curriculum steers (a
    mixture: each domain).
    """

    observation_space: Any = None
    action_space: Any = None
    #: what a curriculum calls this source's task (``curriculum/<task_name>/level``)
    task_name: str = "task"
    _level: int | None = None  # set_level's; None: the task as configured

    @property
    def levels(self) -> int:
        """How many difficulty levels the training items have (1: no knob)."""
        return 1

    @property
    def level(self) -> int | None:
        """The level :meth:`set_level` set (None: the task as configured)."""
        return self._level

    def set_level(self, level: int) -> None:
        """Training iterators made from now on draw items at ``level`` (0 the easiest,
        ``levels - 1`` the hardest), each recording it in ``metadata["level"]``."""
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self.levels:
            raise ValueError(
                f"{self.task_name}: difficulty level must be an integer in "
                f"[0, {self.levels - 1}], got {level!r}"
            )
        self._level = level

    def at_level(self, level: int) -> TaskSource:
        """A copy of this source whose training items are at ``level`` (this one is
        unchanged; both share what they read only)."""
        clone = copy.copy(self)
        clone.set_level(level)
        return clone

    def tasks(self) -> list[Task]:
        """The tasks a curriculum steers: this source as one task (a mixture: each of
        its domains)."""
        return [Task(self.task_name, 1.0, self)]

    @property
    def phases(self) -> dict[str, int]:
        """{name: items} of each phase of the training stream that ends before the run
        does: the controller evaluates at each end (``eval_*_after_<name>``). None here."""
        return {}

    def spaces(self) -> tuple[Any, Any] | None:
        """(observation, action) space of an environment; None for text tasks."""
        if self.observation_space is None:
            return None
        return self.observation_space, self.action_space

    def policy_options(self) -> dict[str, Any]:
        """What the environment decides of its policy beyond the spaces (a multi-agent
        environment's ``agents``: one network per agent); the run adds them to
        ``model.options`` when it builds a policy preset. None here."""
        return {}

    @abstractmethod
    def train_iter(self, seed: int) -> Iterator[Item]:
        """Endless training items, deterministic for ``seed``."""

    @abstractmethod
    def heldout(self, n: int | None = None) -> list[Item]:
        """The first ``n`` held-out items (all of them when ``n`` is None)."""


def _unchanged(item: Item) -> Item:
    return item


@dataclass(frozen=True)
class Task:
    """One task of a source as a curriculum sees it: its name, its share of the source's
    stream (a mixture's weight), the source of its items (leveled or not), and what the
    source does to each item it yields (a mixture tags the item's domain)."""

    name: str
    weight: float
    source: TaskSource
    tag: Callable[[Item], Item] = _unchanged


class FiniteTaskSource(TaskSource):
    """A source backed by two in-memory lists: training items and held-out items.

    Training shuffles every epoch with ``random.Random(seed)`` (one generator for the
    whole stream, so epoch orders differ) and cycles forever.
    """

    def __init__(self, train: list[Item], heldout: list[Item], name: str) -> None:
        self._train, self._heldout, self.name = train, heldout, name

    def __len__(self) -> int:
        return len(self._train)

    def train_iter(self, seed: int) -> Iterator[Item]:
        if not self._train:
            raise ValueError(
                f"{self.name}: no training items: every row is held out (heldout_fraction) "
                "or also in the evaluation file (eval_path)"
            )
        rng = random.Random(seed)
        order = list(range(len(self._train)))
        while True:
            rng.shuffle(order)
            for i in order:
                yield fresh(self._train[i])

    def heldout(self, n: int | None = None) -> list[Item]:
        items = self._heldout if n is None else self._heldout[:n]
        return [fresh(it) for it in items]

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
from collections.abc import Iterator
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


class TaskSource(ABC):
    """Where items come from.

    ``train_iter(seed)`` is infinite and deterministic for a given seed.
    ``heldout(n)`` is the fixed evaluation split (the first ``n`` items, all when
    ``None``): it does not depend on any seed and never overlaps training.
    Each yielded item is a fresh object the caller owns.

    An environment's source also has its Gymnasium spaces (a policy is built for them;
    None for text tasks) and the options its policy needs beyond them, and a source whose training stream comes in phases (offline,
    then online data) says where each ends (:attr:`phases`).
    """

    observation_space: Any = None
    action_space: Any = None

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

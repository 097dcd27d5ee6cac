"""Typed messages between rollout workers, the rollout pool and the backends.

Frozen dataclasses of plain data and tensors: they pickle unchanged through pipes
and Ray's object store, and a reader matches on the type, never on a position.

Commands (pool -> worker)::

    StartItems(items)    one group of ``group_size`` episodes per item (with
                         ``alternates``, more candidates per item for the gate)
    ScoreAhead(batch, items)  the likelihood gate decides for items not yet issued
                         (``selection.score_ahead``, sent to an idle worker)
    Pause() / Resume()   colocated placement: stop / restart decoding
    Stop()               cancel everything and return

Reports (worker -> pool)::

    VersionReport        the engine's weight version (also the heartbeat)
    GroupDone            an item's usable group of trajectories
    GroupRejected        an item that will not be consumed, with outcome and reason
    ScoredAhead          what the gate decided for a ``ScoreAhead`` batch
    WorkerCrashed        the worker loop died (traceback); the backend replaces it

Every item a worker receives is reported exactly once, as ``GroupDone`` or
``GroupRejected``. ``reward_sum / scored`` is the reward of every scored sample,
before any filtering (dynamic sampling biases consumed batches towards mixed groups).
``episode_metrics`` sums per-episode counters (turns, tool calls, ...) over the group;
``rewards`` are the ``group_size`` samples' rewards (what prompt selection learns from).
With ``selection.kind=likelihood``, ``gate`` gives what became of each of the item's
candidates (``chosen``, ``failed``, ``spare`` or a skip reason) and ``spares`` the
candidates handed back to the pool (never lost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from streamrl.core.types import Item, Trajectory

# ------------------------------------------------------------------ commands


@dataclass(frozen=True)
class StartItems:
    items: tuple[Item, ...]
    # selection.kind=likelihood: further candidates for each item (same order, unissued),
    # and the indices of items to generate without the gate (selection/forced)
    alternates: tuple[tuple[Item, ...], ...] = ()
    forced: tuple[int, ...] = ()

    def candidates(self) -> list[list[Item]]:
        """Each item's candidates, the item first."""
        more = self.alternates or ((),) * len(self.items)
        return [[item, *alt] for item, alt in zip(self.items, more, strict=True)]


@dataclass(frozen=True)
class ScoreAhead:
    batch: int  # matches the report to the command (a replaced worker's is ignored)
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Pause:
    pass


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Stop:
    pass


Command = StartItems | ScoreAhead | Pause | Resume | Stop

# ------------------------------------------------------------------ reports


@dataclass(frozen=True)
class VersionReport:
    version: int
    engine_stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupDone:
    item_index: int
    trajectories: tuple[Trajectory, ...]
    reward_sum: float
    scored: int
    episode_metrics: dict[str, float] = field(default_factory=dict)
    rewards: tuple[float, ...] = ()  # each sample's reward, for prompt selection
    gate: tuple[str, ...] = ()  # the likelihood gate: each candidate's outcome
    spares: tuple[Item, ...] = ()  # candidates handed back to the pool


@dataclass(frozen=True)
class GroupRejected:
    item_index: int
    outcome: Literal["filtered", "failed"]
    reason: str
    detail: str = ""
    reward_sum: float = 0.0
    scored: int = 0
    episode_metrics: dict[str, float] = field(default_factory=dict)
    rewards: tuple[float, ...] = ()  # each sample's reward when scored (prompt selection)
    gate: tuple[str, ...] = ()
    spares: tuple[Item, ...] = ()


@dataclass(frozen=True)
class ScoredAhead:
    batch: int
    version: int  # the engine's weight version when scoring began
    outcomes: tuple[str, ...]  # each item's: accepted, spare (not scored) or a skip reason
    accepted: tuple[Item, ...]
    unscored: tuple[Item, ...]  # scoring raised: scored again when issued


@dataclass(frozen=True)
class WorkerCrashed:
    traceback: str


Report = VersionReport | GroupDone | GroupRejected | ScoredAhead | WorkerCrashed


def describe(message: Any) -> str:
    """A short name for logs and errors."""
    return type(message).__name__

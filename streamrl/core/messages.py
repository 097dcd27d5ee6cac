"""Typed messages between rollout workers, the rollout pool and the backends.

Frozen dataclasses of plain data and tensors: they pickle unchanged through pipes
and Ray's object store, and a reader matches on the type, never on a position.

Commands (pool -> worker)::

    StartItems(items)    one group of ``group_size`` episodes per item (with
                         ``plans``, what the run's group sampler says of each)
    SamplerWork(payload) work of the group sampler's for an idle worker
    Pause() / Resume()   colocated placement: stop / restart decoding
    Stop()               cancel everything and return

Reports (worker -> pool)::

    VersionReport        the engine's weight version (also the heartbeat)
    GroupDone            an item's usable group of trajectories
    GroupRejected        an item that will not be consumed, with outcome and reason
    SamplerResult        the group sampler's answer to a ``SamplerWork``
    WorkerCrashed        the worker loop died (traceback); the backend replaces it

Every item a worker receives is reported exactly once, as ``GroupDone`` or
``GroupRejected``. ``reward_sum / scored`` is the reward of every scored sample,
before any filtering (dynamic sampling biases consumed batches towards mixed groups).
``episode_metrics`` sums per-episode counters (turns, tool calls, ...) over the group;
``rewards`` are the ``group_size`` samples' rewards (what a group sampler may learn from),
and ``feedback`` what the worker's side of the group sampler tells its pool's side of the
item (:mod:`streamrl.rollout.selection`). Plans, payloads and feedback are the sampler's
own picklable data: the pool and the worker pass them on unread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from streamrl.core.types import Item, Trajectory

# ------------------------------------------------------------------ commands


@dataclass(frozen=True)
class StartItems:
    items: tuple[Item, ...]
    plans: tuple[Any, ...] = ()  # the group sampler's plan of each item (none: all None)

    def planned(self) -> list[tuple[Item, Any]]:
        """Each item with its plan."""
        plans = self.plans or (None,) * len(self.items)
        return list(zip(self.items, plans, strict=True))


@dataclass(frozen=True)
class SamplerWork:
    payload: Any


@dataclass(frozen=True)
class Pause:
    pass


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Stop:
    pass


Command = StartItems | SamplerWork | Pause | Resume | Stop

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
    rewards: tuple[float, ...] = ()  # each sample's reward, for the group sampler
    feedback: Any = None  # the group sampler's worker side to its pool side


@dataclass(frozen=True)
class GroupRejected:
    item_index: int
    outcome: Literal["filtered", "failed"]
    reason: str
    detail: str = ""
    reward_sum: float = 0.0
    scored: int = 0
    episode_metrics: dict[str, float] = field(default_factory=dict)
    rewards: tuple[float, ...] = ()  # each sample's reward when scored
    feedback: Any = None
    # a group the algorithm dropped (``finish_group``), its scored samples, when the
    # algorithm learns from dropped groups (``Algorithm.wants_dropped``)
    samples: tuple[Trajectory, ...] = ()


@dataclass
class DroppedGroup:
    """The scored samples of an item whose group the algorithm dropped (all wrong or all
    right under dynamic sampling), with the item's reference answer (None: it has none),
    for an algorithm that learns from them (``Algorithm.observe_dropped``)."""

    item_index: int
    samples: list[Trajectory]
    answer: str | None


@dataclass(frozen=True)
class SamplerResult:
    payload: Any


@dataclass(frozen=True)
class WorkerCrashed:
    traceback: str


Report = VersionReport | GroupDone | GroupRejected | SamplerResult | WorkerCrashed


def describe(message: Any) -> str:
    """A short name for logs and errors."""
    return type(message).__name__

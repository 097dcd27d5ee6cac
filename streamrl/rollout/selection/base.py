"""The group sampler: the one extension point for what is generated, and how.

A run's sampler has two sides, each built from the run's config in its own process.

The pool's side (the controller's rollout pool, on its pump thread under the pool's
lock unless said otherwise) decides which item is issued under each index and what the
item's worker needs with it (its *plan*), learns from each finished group, may hand an
idle worker work of its own, and keeps its state in the pool's checkpoints and its
counters in the step metrics. The worker's side (every rollout worker's event loop)
decides how an item's group is drawn: which item is rolled out after all (a gate may
pick another candidate, or none), and with what engine view and seed each sample is
drawn (``rollout.group_sampling``). The pool and the rollout worker call nothing else.

The base class is the plain sampler (``selection.kind: none``): every drawn item is
issued, and its group is drawn as ``rollout.group_sampling`` says. A new idea
subclasses it, overrides what it changes, and registers itself
(:func:`streamrl.rollout.selection.registry.register_sampler`)::

    @register_sampler("odd_out")
    class OddOut(GroupSampler):
        def issue(self, index: int) -> Item:
            item = self.source.draw()
            return item if int(item.id) % 2 == 0 else self.source.draw()

Every plan, work payload and feedback a sampler passes between its sides must pickle
(workers may run in other processes or on other machines).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from streamrl.core.engine import InferenceEngine
from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import WEIGHT_KEY, Item, SamplingParams, Trajectory
from streamrl.rollout.selection.draws import Draws, independent

if TYPE_CHECKING:
    from streamrl.config import RolloutConfig, SelectionConfig
    from streamrl.sources.base import TaskSource

Report = GroupDone | GroupRejected
#: the plain rollout of an item's group, drawn by the sampler (None: cancelled)
Roll = Callable[[Item], Awaitable[Report | None]]


@dataclass(frozen=True)
class Source:
    """What the pool lends its sampler: ``draw()`` takes the task source's next item (it
    counts in the source's position, so a drawn item must be issued, kept or counted),
    the stream's batch size and staleness bound η, and the task source itself (for a
    sampler that steers it, as the curriculum does: it then keeps its own position in
    its state; None where the pool has only the items)."""

    draw: Callable[[], Item]
    items_per_batch: int = 1
    max_staleness: int = 0
    task: TaskSource | None = None


@dataclass(frozen=True)
class SamplerSetup:
    """What a sampler is built from: the ``selection`` config section, the group size, the
    run's seed, the draws ``rollout.group_sampling`` names, and, on a worker's side, the
    tokenizer and the run's sampling parameters (None on the pool's)."""

    selection: Any
    group_size: int
    seed: int = 0
    draws: Draws = independent
    tokenizer: Any = None
    sampling: SamplingParams | None = None


@dataclass(frozen=True, kw_only=True)
class SamplerContext:
    """What preflight's checks of a sampler or a draw rule see of the run: the
    ``selection`` and ``rollout`` sections, and three facts of other sections, each named
    (``streamrl.run.assembly.sampler_context`` fills it)."""

    selection: SelectionConfig
    rollout: RolloutConfig
    algorithm: str
    """algorithm.name."""
    policy: bool
    """The samples come from an environment policy (``rollout.episode: gym``, or a
    policy preset or saved policy as ``model.name_or_path``), not a language model."""
    endpoint: bool
    """endpoint.enabled: external agents bring their own prompts and requests."""


class GroupSampler:
    """The plain sampler, and the protocol every sampler keeps (see the module docstring).

    Class attributes: ``own_options``, the ``selection.*`` options only this kind reads,
    each with its default and why (preflight refuses one set under another kind)."""

    own_options: ClassVar[dict[str, tuple[Any, str]]] = {}

    def __init__(self, draws: Draws = independent) -> None:
        self.draws = draws
        self.source = Source(_unattached)

    # ------------------------------------------------------------ built from the config

    @classmethod
    def build(cls, setup: SamplerSetup) -> GroupSampler:
        """The sampler of a run (either side)."""
        return cls(setup.draws)

    @classmethod
    def check(cls, run: SamplerContext) -> None:
        """Preflight: raise ValueError, one line naming the keys, where the run's config
        cannot work with this sampler."""

    # ------------------------------------------------------------ the pool's side

    def attach(self, source: Source) -> None:
        """The pool this sampler issues for (called once, before anything else)."""
        self.source = source

    def issue(self, index: int) -> Item:
        """The item to issue as ``index`` (the pool sets its ``index``)."""
        return self.source.draw()

    def plan(self, index: int) -> Any:
        """What the worker gets with outstanding item ``index``, each time it is sent (a
        re-issued item gets it again); None: nothing."""
        return None

    def finished(self, item: Item, report: Report) -> None:
        """Issued ``item`` ended with ``report`` (before the stream takes it)."""

    def published(self, version: int, outstanding: set[int]) -> None:
        """The trainer publishes ``version`` (on its thread, before the weights go out and
        any item is admitted at them); ``outstanding``: the items not yet ended."""

    def catch_up(self) -> None:
        """The pump's turn begins (before it takes reports), or a checkpoint is taken."""

    def idle_work(self, worker: int, version: int) -> Any:
        """Work for ``worker``, idle at weight ``version`` (nothing in flight, the stream
        full), sent as ``SamplerWork``; None: none. Not while the pool is paused."""
        return None

    def work_done(self, worker: int, result: Any) -> None:
        """``worker`` answered its work with ``result``."""

    def worker_lost(self, worker: int) -> None:
        """``worker`` was lost: its work is not to be answered (keep what it held)."""

    def state_dict(self, outstanding: set[int]) -> Any:
        """What a checkpoint keeps (None: nothing); ``outstanding`` items are issued again
        after a resume, and report again."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict`'s state (before the pool starts)."""

    def metrics(self) -> dict[str, float]:
        """Cumulative counters for the step metrics and the run's summary (any thread)."""
        return {}

    def batch_metrics(self, samples: list[Trajectory]) -> dict[str, float]:
        """Metrics of a consumed batch's samples (the trainer's thread): the per-sample
        weights a sampler gave its items (``WEIGHT_KEY``), before the update normalises
        them, as ``selection/weight_{mean,max}``."""
        weights = [float(t.metadata[WEIGHT_KEY]) for t in samples if WEIGHT_KEY in t.metadata]
        if not weights:
            return {}
        return {
            "selection/weight_mean": sum(weights) / len(weights),
            "selection/weight_max": max(weights),
        }

    # ------------------------------------------------------------ the worker's side

    async def rollout(
        self, engine: InferenceEngine, item: Item, plan: Any, roll: Roll
    ) -> Report | None:
        """The report of ``item`` (issued with ``plan``); ``roll(item)`` rolls an item's
        group out. None: cancelled (the worker is shutting down)."""
        return await roll(item)

    def group(
        self, engine: InferenceEngine, item: Item, group_size: int, seed: int
    ) -> list[tuple[InferenceEngine, int]]:
        """The engine view and sampling seed of each of the group's samples (as many as
        the group has: a sampler may give an item another number than ``group_size``)."""
        return self.draws(engine, seed, item.index, group_size)

    async def work(self, engine: InferenceEngine, payload: Any) -> Any:
        """Do the pool side's :meth:`idle_work` on this worker's engine."""
        raise TypeError(f"{type(self).__name__} hands out no work (got {payload!r})")


def _unattached() -> Item:
    raise RuntimeError("the group sampler draws only once a pool has attached it")

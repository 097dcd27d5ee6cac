"""The curriculum sampler (``selection.kind: curriculum``): what is generated moves with
what the policy can learn from.

Three parts, each optional, all behind the group sampler hook:

* **Difficulty curriculum.** Each task of the run's source (a mixture: each domain) with
  a difficulty knob (:attr:`streamrl.sources.base.TaskSource.levels`) has a level, moved
  by the success rate its groups measure (:class:`~streamrl.rollout.selection.levels.
  LevelController`: a target band, minimum evidence, and hysteresis).
* **Bandit over tasks** (``selection.curriculum.bandit: boltzmann``): each item's task
  is drawn by a Boltzmann bandit whose arms earn the groups' mean |advantage| or the
  task's learning progress (:class:`~streamrl.rollout.selection.levels.TaskBandit`);
  otherwise by the mixture's weights.
* **Rollout budgets** (``selection.budgets.enabled``): each item's number of samples
  (:mod:`streamrl.rollout.selection.budgets`), which the worker's side draws.

Items. The sampler draws from its own stream per (task, level): the task's source at
that level, seeded by (run seed, task, level), at a position the sampler counts. Each
item records its level (``metadata["level"]``) and task (``metadata["curriculum_task"]``).
The item's task is drawn by a uniform that is a pure function of (run seed, item index).

Determinism. Finished groups are pending until the trainer publishes a version; then
those of ended items are taken in, in item order (as the posterior sampler does). At
η = 0 every decision is then a function of the seed and the outcomes, not of timing. A
checkpoint keeps the levels, windows, bandit, budgets' evidence, each stream's position
and the pending outcomes of ended items; outstanding items are issued again from the
pool's checkpoint (same level, same budget) and report again, counted once.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

from streamrl.algorithms.base import EQUAL_REWARDS
from streamrl.config.curriculum import BudgetsConfig, CurriculumConfig
from streamrl.core.engine import InferenceEngine
from streamrl.core.messages import GroupDone
from streamrl.core.types import Item
from streamrl.rollout.selection.base import GroupSampler, Report, SamplerContext, SamplerSetup
from streamrl.rollout.selection.budgets import RolloutBudgets, budget_of
from streamrl.rollout.selection.gate import uniform
from streamrl.rollout.selection.levels import LevelController, TaskBandit
from streamrl.rollout.selection.registry import register_sampler
from streamrl.sources.base import LEVEL_KEY, Task, stable_hash

TASK_KEY = "curriculum_task"  # item.metadata: the curriculum task it was drawn for


@register_sampler("curriculum")
class CurriculumSampler(GroupSampler):
    """See the module docstring. Built on both sides; only the pool's side is attached."""

    own_options = {
        "curriculum": (CurriculumConfig(), "the difficulty curriculum and the bandit over tasks"),
        "budgets": (BudgetsConfig(), "per-prompt rollout budgets"),
    }

    def __init__(self, setup: SamplerSetup) -> None:
        super().__init__(setup.draws)
        self.config, self.seed = setup.selection.curriculum, setup.seed
        self.group_size = setup.group_size
        b = setup.selection.budgets
        self.budgets = (
            RolloutBudgets(
                setup.group_size,
                min_samples=b.min_samples,
                max_samples=b.max_samples,
                prior_strength=b.prior_strength,
                smoothing=b.smoothing,
                success_threshold=self.config.success_threshold,
            )
            if b.enabled
            else None
        )
        self.tasks: list[Task] = []
        self.levels: list[LevelController] = []
        self.bandit: TaskBandit | None = None
        self.positions: dict[tuple[int, int], int] = {}  # (task, level) -> items drawn
        self._streams: dict[tuple[int, int], Iterator[Item]] = {}
        self._pending: dict[int, tuple[int, int, str, tuple[float, ...]]] = {}
        self.version = 0  # the last weight version published
        self.dropped_in_a_row, self.stalls = 0, 0
        self._usable: set[int] = set()  # reported usable, not yet taken in (in the stream)
        # issue/finished run on the pump's thread, published on the trainer's, metrics on any
        self._lock = threading.RLock()

    @classmethod
    def build(cls, setup: SamplerSetup) -> CurriculumSampler:
        return cls(setup)

    @classmethod
    def check(cls, run: SamplerContext) -> None:
        """The budgets bracket rollout.group_size (their mean is kept at it)."""
        b, g = run.selection.budgets, run.rollout.group_size
        if b.enabled and not b.min_samples <= g <= b.max_samples:
            raise ValueError(
                f"rollout.group_size={g} must lie in [selection.budgets.min_samples="
                f"{b.min_samples}, selection.budgets.max_samples={b.max_samples}]: the "
                "budgets keep their mean at the group size"
            )

    # ------------------------------------------------------------ the pool's side

    def attach(self, source: Any) -> None:
        super().attach(source)
        if source.task is None:
            raise RuntimeError("selection.kind=curriculum draws from the task source itself")
        c = self.config
        self.tasks = source.task.tasks()
        for task in self.tasks:
            n = task.source.levels
            start = min(max(c.start_level if c.start_level >= 0 else n + c.start_level, 0), n - 1)
            self.levels.append(
                LevelController(
                    n, tuple(c.band), c.min_groups, c.backoff, c.max_backoff, level=start
                )
            )
        if c.bandit == "boltzmann":
            weights = [t.weight for t in self.tasks]
            self.bandit = TaskBandit(
                weights, c.temperature, c.learning_rate, c.exploration, c.bandit_reward
            )

    def issue(self, index: int) -> Item:
        with self._lock:
            return self._issue(index)

    def _issue(self, index: int) -> Item:
        k = self._choose_task(index)
        level = self.levels[k].level
        item = next(self._stream(k, level))
        self.positions[(k, level)] = self.positions.get((k, level), 0) + 1
        item = self.tasks[k].tag(item)
        item.metadata[LEVEL_KEY] = level
        item.metadata[TASK_KEY] = self.tasks[k].name
        if self.budgets is not None:
            self.budgets.assign(item, self.levels[k].success())
        return item

    def _choose_task(self, index: int) -> int:
        if len(self.tasks) == 1:
            return 0
        u = uniform(self.seed, "curriculum/task", index)
        if self.bandit is not None:
            return self.bandit.choose(u)
        weights = [t.weight for t in self.tasks]
        return TaskBandit(weights, exploration=1.0).choose(u)

    def _stream(self, k: int, level: int) -> Iterator[Item]:
        """Task ``k``'s items at ``level``, from where this sampler left it."""
        key = (k, level)
        if key not in self._streams:
            source = self.tasks[k].source
            leveled = source.at_level(level) if source.levels > 1 else source
            seed = stable_hash(f"{self.seed}:{self.tasks[k].name}:{level}") % 2**31
            drawn = self.positions.get(key, 0)
            self._streams[key] = itertools.islice(leveled.train_iter(seed), drawn, None)
        return self._streams[key]

    def finished(self, item: Item, report: Report) -> None:
        if not report.rewards:  # failed before scoring: no evidence
            return
        k = self._task_index(item)
        level = int(item.metadata.get(LEVEL_KEY, 0))
        with self._lock:  # a re-issued item reports again: same index, counted once
            self._pending[report.item_index] = (k, level, item.id, tuple(report.rewards))
            if isinstance(report, GroupDone):
                self._usable.add(report.item_index)
            self._note_stall(report)

    def _note_stall(self, report: Report) -> None:
        """Every group dropped since ``stall_groups`` reports: no batch forms, so no
        publish comes; take in what was reported now (see the config key)."""
        if isinstance(report, GroupDone) or report.reason != EQUAL_REWARDS:
            self.dropped_in_a_row = 0
            return
        self.dropped_in_a_row += 1
        if self.config.stall_groups and self.dropped_in_a_row >= self.config.stall_groups:
            self.dropped_in_a_row = 0
            self.stalls += 1
            self._take_in(self.version, set(self._usable))  # (those wait for their batch)

    def _task_index(self, item: Item) -> int:
        name = item.metadata.get(TASK_KEY)
        return next((k for k, t in enumerate(self.tasks) if t.name == name), 0)

    def published(self, version: int, outstanding: set[int]) -> None:
        """Take in the outcomes of the items that ended, in item order."""
        with self._lock:
            self._take_in(version, outstanding)

    def _take_in(self, version: int, outstanding: set[int]) -> None:
        self.version = version
        threshold = self.config.success_threshold
        for index in sorted(i for i in self._pending if i not in outstanding):
            k, level, key, rewards = self._pending.pop(index)
            self._usable.discard(index)
            successes = sum(r > threshold for r in rewards)
            self.levels[k].observe(level, successes, len(rewards))
            if self.bandit is not None:
                self.bandit.observe(k, list(rewards), successes)
            if self.budgets is not None:
                self.budgets.observe(index, key, list(rewards))
        if self.budgets is not None:
            self.budgets.advance(version, outstanding)

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        with self._lock:
            return self._state(outstanding)

    def _state(self, outstanding: set[int]) -> dict[str, Any]:
        return {
            "levels": [c.state() for c in self.levels],
            "bandit": None if self.bandit is None else self.bandit.state(),
            "budgets": None if self.budgets is None else self.budgets.state_dict(outstanding),
            "positions": dict(self.positions),
            "pending": {i: p for i, p in self._pending.items() if i not in outstanding},
            "stall": [self.version, self.dropped_in_a_row, self.stalls],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._load(state)

    def _load(self, state: dict[str, Any]) -> None:
        for controller, saved in zip(self.levels, state["levels"], strict=True):
            controller.load(saved)
        if self.bandit is not None and state["bandit"] is not None:
            self.bandit.load(state["bandit"])
        if self.budgets is not None and state["budgets"] is not None:
            self.budgets.load_state_dict(state["budgets"])
        self.positions = dict(state["positions"])
        self._streams = {}
        self._pending = dict(state["pending"])
        self.version, self.dropped_in_a_row, self.stalls = state["stall"]

    def metrics(self) -> dict[str, float]:
        """Per task: ``curriculum/<task>/level``, ``/success`` (the success rate measured
        at that level, all its groups), ``/moves``, ``/level_<L>/success`` and
        ``/level_<L>/groups`` of each level it has measured; with the bandit its arm's
        ``/probability``; with budgets ``budgets/*``."""
        with self._lock:
            return self._metrics()

    def _metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        probs = self.bandit.probabilities() if self.bandit is not None else None
        for k, (task, c) in enumerate(zip(self.tasks, self.levels, strict=True)):
            p = f"curriculum/{task.name}"
            out[f"{p}/level"] = float(c.level)
            out[f"{p}/moves"] = float(c.moves)
            if (rate := c.success()) is not None:
                out[f"{p}/success"] = rate
            for level, (s, n, groups) in sorted(c.per_level.items()):
                if n:
                    out[f"{p}/level_{level}/success"] = s / n
                    out[f"{p}/level_{level}/groups"] = float(groups)
            if probs is not None:
                out[f"{p}/probability"] = probs[k]
        if self.stalls:
            out["curriculum/stalls"] = float(self.stalls)
        if self.budgets is not None:
            out.update(self.budgets.metrics())
        return out

    # ------------------------------------------------------------ the worker's side

    def group(
        self, engine: InferenceEngine, item: Item, group_size: int, seed: int
    ) -> list[tuple[InferenceEngine, int]]:
        """The item's budget of samples (``group_size`` without one)."""
        return self.draws(engine, seed, item.index, budget_of(item, group_size))

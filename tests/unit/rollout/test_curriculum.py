"""The curriculum sampler: a task's level follows its measured success rate (and does not
oscillate on a boundary), per-level success is in the metrics, the bandit prefers the
task that teaches, budgets spend samples near p = 1/2, the stream's books balance with
budgets on through the real pool and worker, and a resume from its state is exact."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import pytest

from streamrl.config import load_config
from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import Item, SamplingParams
from streamrl.rollout.selection import build_sampler
from streamrl.rollout.selection.base import Source
from streamrl.rollout.selection.budgets import BUDGET_KEY, RolloutBudgets
from streamrl.rollout.selection.curriculum import TASK_KEY, CurriculumSampler
from streamrl.rollout.selection.levels import LevelController, TaskBandit
from streamrl.run.preflight import PreflightError, check_selection
from streamrl.sources import build_task_source
from streamrl.sources.base import LEVEL_KEY
from streamrl.stream.backends import RolloutPool
from streamrl.stream.sample_stream import SampleStream
from tests.selection_backend import InlineBackend

Outcome = Callable[[Item], list[float]]


def _cfg(*overrides: str):
    return load_config(None, ["selection.kind=curriculum", "rollout.group_size=4", *overrides])


def _sampler(task, *overrides: str) -> CurriculumSampler:
    cfg = _cfg(*overrides)
    check_selection(cfg)
    sampler = build_sampler(cfg.selection, cfg.rollout, cfg.seed)
    assert isinstance(sampler, CurriculumSampler)
    sampler.attach(Source(_no_draw, 4, 0, task))
    return sampler


def _no_draw() -> Item:
    raise AssertionError("the curriculum draws from its own streams")


def _steps(sampler: CurriculumSampler, outcome: Outcome, steps: int, start: int = 0) -> list:
    """``steps`` synchronous steps of 4 items: issue, report ``outcome``, publish."""
    issued = []
    for step in range(steps):
        items = [sampler.issue(i) for i in range(start + 4 * step, start + 4 * step + 4)]
        for i, item in enumerate(items):
            item.index = start + 4 * step + i
            rewards = tuple(outcome(item))
            sampler.finished(item, GroupRejected(item.index, "filtered", "x", rewards=rewards))
            issued.append((item.id, item.metadata[LEVEL_KEY], item.metadata.get(BUDGET_KEY)))
        sampler.published(step + 1, set())
    return issued


def _by_level(rates: dict[int, float]) -> Outcome:
    """Each item's 4 samples: round(4 * rate of its level) right."""

    def outcome(item: Item) -> list[float]:
        right = round(4 * rates[item.metadata[LEVEL_KEY]])
        return [1.0] * right + [0.0] * (4 - right)

    return outcome


# ------------------------------------------------------------------ the level


def test_the_level_goes_up_above_the_band_and_down_below_it() -> None:
    c = LevelController(levels=4, band=(0.2, 0.8), min_groups=3)
    for _ in range(9):  # all right: one level up per 3 groups
        c.observe(c.level, 4, 4)
    assert (c.level, c.moves) == (3, 3)
    for _ in range(2):  # not yet enough evidence
        c.observe(3, 0, 4)
    assert c.level == 3
    c.observe(3, 0, 4)  # all wrong: down (a reversal: the next move needs twice as many)
    assert (c.level, c.need) == (2, 2.0)
    for _ in range(6):  # inside the band: it stays
        c.observe(2, 2, 4)
    assert c.level == 2
    c.observe(1, 4, 4)  # a late group of an older level counts for that level only
    assert c.success(1) == 1.0 and c.window[2] == 6 and c.level == 2


def test_a_policy_on_a_boundary_moves_ever_more_slowly() -> None:
    """Level 0 always right, level 1 always wrong: without hysteresis the level would
    flip every min_groups groups; with backoff 2 the waits double."""

    def flips(backoff: float) -> int:
        c = LevelController(levels=2, band=(0.2, 0.8), min_groups=2, backoff=backoff)
        for _ in range(400):
            c.observe(c.level, 4 if c.level == 0 else 0, 4)
        return c.moves

    assert flips(1.0) == 200
    assert flips(2.0) <= 30  # 2 + 4 + 8 + 16 + 32 * ...: the cap (16x) bounds the wait


# ------------------------------------------------------------------ the sampler


def test_the_curriculum_climbs_while_it_succeeds_and_logs_each_level() -> None:
    source = build_task_source("arithmetic", digits=3, operators="+")
    sampler = _sampler(source, "selection.curriculum.min_groups=4")
    issued = _steps(sampler, _by_level({0: 1.0, 1: 0.5, 2: 0.0}), steps=6)
    assert [lvl for _, lvl, _ in issued[:4]] == [0] * 4  # starts at the easiest
    assert issued[-1][1] == 1  # climbed to 1, where half is right: it stays
    m = sampler.metrics()
    assert m["curriculum/arithmetic/level"] == 1.0 and m["curriculum/arithmetic/moves"] == 1
    assert m["curriculum/arithmetic/level_0/success"] == 1.0
    assert m["curriculum/arithmetic/level_0/groups"] == 4
    assert m["curriculum/arithmetic/success"] == m["curriculum/arithmetic/level_1/success"] == 0.5
    # the items are the source's at each level: 1-digit operands, then up to 2 digits
    level_0 = [i for i, lvl, _ in issued if lvl == 0]
    assert all(len(x) == 1 for i in level_0 for x in i.removeprefix("arith:").split("+"))


def test_a_level_too_hard_steps_down_to_one_that_teaches() -> None:
    source = build_task_source("reasoning_gym", task="leg_counting", size=50, heldout_size=4)
    sampler = _sampler(
        source, "selection.curriculum.start_level=3", "selection.curriculum.min_groups=4"
    )
    rates = {3: 0.0, 2: 0.0, 1: 0.5, 0: 1.0}
    issued = _steps(sampler, _by_level(rates), steps=5)
    assert [lvl for _, lvl, _ in issued[::4]] == [3, 2, 1, 1, 1]
    assert issued[-1][0].endswith(":L1")  # a reasoning-gym entry of level 1's configuration
    assert sampler.metrics()["curriculum/leg_counting/level"] == 1.0


def test_a_level_where_every_group_is_dropped_is_left_without_a_publish() -> None:
    """No usable group, no batch, no publish: after stall_groups drops in a row the
    outcomes are taken in at once, and the level steps down."""
    source = build_task_source("arithmetic", digits=3, operators="+")
    sampler = _sampler(
        source,
        "selection.curriculum.start_level=-1",
        "selection.curriculum.min_groups=4",
        "selection.curriculum.stall_groups=4",
    )
    levels = []
    for index in range(8):
        item = sampler.issue(index)
        item.index = index
        levels.append(item.metadata[LEVEL_KEY])
        dropped = GroupRejected(index, "filtered", "zero_reward_std", rewards=(0.0,) * 4)
        sampler.finished(item, dropped)
    assert levels == [2, 2, 2, 2, 1, 1, 1, 1]
    m = sampler.metrics()
    assert m["curriculum/arithmetic/level"] == 0.0 and m["curriculum/stalls"] == 2


def test_the_bandit_prefers_the_task_that_teaches() -> None:
    mixture = build_task_source(
        "mixture",
        sources=[
            {"name": "mixed", "kind": "arithmetic", "options": {"digits": 1}},
            {"name": "hopeless", "kind": "arithmetic", "options": {"digits": 1}},
        ],
    )

    def outcome(item: Item) -> list[float]:
        return [1.0, 0.0, 1.0, 0.0] if item.metadata[TASK_KEY] == "mixed" else [0.0] * 4

    sampler = _sampler(mixture, "selection.curriculum.bandit=boltzmann")
    issued = _steps(sampler, outcome, steps=20)
    late = [i for i, _, _ in issued[40:]]
    assert sum(i.startswith("mixed/") for i in late) >= 0.8 * len(late)
    assert sampler.metrics()["curriculum/mixed/probability"] > 0.9
    # learning progress: the arm whose success rate moves earns, the flat one does not
    bandit = TaskBandit([1.0, 1.0], reward="progress")
    for t in range(30):
        bandit.observe(0, [1.0] * min(t, 8) + [0.0] * (8 - min(t, 8)), min(t, 8))
        bandit.observe(1, [1.0, 0.0] * 4, 4)
    assert bandit.q[0] > 0.05 > bandit.q[1] == 0.0


# ------------------------------------------------------------------ budgets


def test_budgets_give_more_samples_near_one_half_than_at_zero_or_one() -> None:
    budgets = RolloutBudgets(group_size=8, min_samples=2, max_samples=16)
    for index, (key, rewards) in enumerate(
        [("half", [1.0, 0.0] * 4), ("never", [0.0] * 8), ("always", [1.0] * 8)] * 3
    ):
        budgets.observe(index, key, rewards)
    budgets.advance(1, set())
    given: dict[str, list[int]] = {"half": [], "never": [], "always": [], "new": []}
    for _ in range(30):
        for key in given:
            given[key].append(budgets.assign(Item(id=key, prompt="?"), rate=None))
    last = {k: v[-1] for k, v in given.items()}
    assert last["half"] > last["new"] > last["never"] and last["new"] > last["always"]
    assert last["half"] >= 12 and last["never"] <= 4 and last["always"] <= 4
    assert 7 <= budgets.metrics()["budgets/samples_mean"] <= 9  # about rollout.group_size
    # a task level measured near 1/2 makes its unseen prompts' budgets larger
    assert budgets.weight("unseen", 0.5) > budgets.weight("unseen", 0.02)


def test_budgets_must_bracket_the_group_size() -> None:
    with pytest.raises(PreflightError, match=r"rollout.group_size=4 must lie in"):
        check_selection(_cfg("selection.budgets.enabled=true", "selection.budgets.min_samples=6"))
    with pytest.raises(
        PreflightError, match=r"selection.budgets.enabled=true needs selection.kind=cu"
    ):
        check_selection(
            load_config(None, ["selection.kind=posterior", "selection.budgets.enabled=true"])
        )


def test_the_books_balance_with_budgets_through_the_real_pool_and_worker() -> None:
    cfg = _cfg("selection.budgets.enabled=true", "selection.budgets.max_samples=8")
    source = build_task_source(  # the backend answers every "w..." item all wrong
        "mixture",
        sources=[
            {"name": "wrong", "kind": "arithmetic", "options": {"digits": 1}},
            {"name": "mixed", "kind": "arithmetic", "options": {"digits": 1}},
        ],
    )
    pool_side = build_sampler(cfg.selection, cfg.rollout, cfg.seed)
    worker_side = build_sampler(cfg.selection, cfg.rollout, cfg.seed, None, SamplingParams())
    stream = SampleStream(items_per_batch=2, max_staleness=0)
    backend = InlineBackend(worker_side)
    pool = RolloutPool(backend, stream, iter(()), sampler=pool_side, task_source=source)
    pool.start()
    consumed = []
    try:
        for step in range(1, 9):
            deadline = time.monotonic() + 60
            while (groups := stream.get_batch(timeout=0.05)) is None:
                pool.raise_if_failed()
                assert time.monotonic() < deadline, "no batch"
            consumed += groups
            if step < 8:
                pool.publish({}, step)
                stream.set_trainer_version(step)
    finally:
        pool.stop()
    state, _ = pool.checkpoint()
    stream.close()
    stream.check_accounting()
    s = stream.stats
    assert s.consumed == 16 and s.issued == s.consumed + sum(s.filtered.values())
    items = [it for cmd in backend.commands for it in cmd.items]
    budgets = [it.metadata[BUDGET_KEY] for it in items]
    assert backend.samples == sum(budgets)  # the worker drew each item's own budget
    wrong = [it.metadata[BUDGET_KEY] for it in items[8:] if it.id.startswith("wrong/")]
    mixed = [it.metadata[BUDGET_KEY] for it in items[8:] if it.id.startswith("mixed/")]
    assert max(wrong) < min(mixed)  # hopeless prompts get fewer samples than mixed ones
    by_index = {it.index: it.metadata[BUDGET_KEY] for it in items}
    assert all(len(g.trajectories) == by_index[g.item_index] for g in consumed)
    assert pool.sampler.metrics()["curriculum/wrong/success"] == 0.0
    assert "selection" in state and pool.drawn == 0  # its own streams; its state is kept


def test_a_resume_from_the_checkpointed_state_goes_on_exactly() -> None:
    """Items 0-5 ended, 6-7 outstanding at the checkpoint; the resumed sampler gets 6-7
    issued again (from the pool's checkpoint) and their reports, and then issues what
    the uninterrupted one issues."""
    mixture_spec = [
        {"name": "add", "kind": "arithmetic", "options": {"digits": 3, "operators": "+"}},
        {"name": "rg", "kind": "reasoning_gym", "options": {"task": "leg_counting", "size": 40}},
    ]
    overrides = (
        "selection.curriculum.bandit=boltzmann",
        "selection.curriculum.min_groups=2",
        "selection.budgets.enabled=true",
    )
    rates = {0: 1.0, 1: 0.75, 2: 0.25, 3: 0.0}
    outcome = _by_level(rates)

    def run(resume: bool) -> tuple[list, dict]:
        sampler = _sampler(build_task_source("mixture", sources=mixture_spec), *overrides)
        issued = _steps(sampler, outcome, steps=3)
        items = [sampler.issue(i) for i in range(12, 20)]
        for i, item in enumerate(items[:6]):
            item.index = 12 + i
            sampler.finished(item, GroupDone(item.index, (), 0.0, 4, rewards=tuple(outcome(item))))
        if resume:  # the pool keeps items 18-19 and the sampler's state; a new run loads
            state = copy.deepcopy(sampler.state_dict({18, 19}))
            kept = copy.deepcopy(items[6:])
            sampler = _sampler(build_task_source("mixture", sources=mixture_spec), *overrides)
            sampler.load_state_dict(state)
            items[6:] = kept
        for i, item in enumerate(items[6:]):
            item.index = 18 + i
            sampler.finished(item, GroupDone(item.index, (), 0.0, 4, rewards=tuple(outcome(item))))
        sampler.published(4, set())
        issued += [(it.id, it.metadata[LEVEL_KEY], it.metadata[BUDGET_KEY]) for it in items]
        issued += _steps(sampler, outcome, steps=3, start=20)
        return issued, sampler.metrics()

    straight, resumed = run(False), run(True)
    assert resumed == straight
    assert len({lvl for _, lvl, _ in straight[0]}) > 1  # the levels moved on the way

"""The group sampler is the one place a selection idea plugs in: a new sampler, written
and registered in this file alone, is selected by ``selection.kind``, passes preflight,
and runs through the real rollout pool and rollout worker (its plans, its feedback, its
state across a checkpoint, its metrics) with the stream's books balanced; and through a
real run."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest

from streamrl.config import load_config
from streamrl.core.types import Item, SamplingParams
from streamrl.rollout.selection import GroupSampler, build_sampler, register_sampler
from streamrl.run.preflight import PreflightError, check_group_sampling, check_selection
from streamrl.run.session import run_training
from streamrl.stream.backends import RolloutPool
from streamrl.stream.sample_stream import SampleStream
from tests.selection_backend import InlineBackend
from tests.unit.rollout.test_selection import SHORT_RUN

# ------------------------------------------------------------------ the new idea


@register_sampler("second_look")
class SecondLook(GroupSampler):
    """Issue a prompt whose group came out all wrong once more, before any fresh draw (a
    second look at a hard prompt); its plan tells the worker it is a second look, and
    the worker's side says so back on the item's report."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting: deque[Item] = deque()  # all wrong once, not yet issued again
        self.second: set[int] = set()  # outstanding items that are second looks
        self.counts: Counter[str] = Counter()

    def issue(self, index: int) -> Item:
        if not self.waiting:
            return self.source.draw()
        self.second.add(index)
        self.counts["second_looks"] += 1
        return dataclasses.replace(self.waiting.popleft())

    def plan(self, index: int) -> str | None:
        return "second look" if index in self.second else None

    def finished(self, item: Item, report: Any) -> None:
        self.second.discard(report.item_index)
        if report.feedback != "second look" and report.rewards and max(report.rewards) == 0:
            self.waiting.append(item)

    async def rollout(self, engine: Any, item: Item, plan: Any, roll: Any) -> Any:
        report = await roll(item)
        return None if report is None else dataclasses.replace(report, feedback=plan)

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        second = sorted(self.second & outstanding)
        return {"waiting": list(self.waiting), "second": second, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waiting, self.second = deque(state["waiting"]), set(state["second"])
        self.counts = Counter(state["counts"])

    def metrics(self) -> dict[str, float]:
        return {"selection/second_looks": float(self.counts["second_looks"])}


# ------------------------------------------------------------------ through the real pool


def _source():
    for n in itertools.count():  # every third prompt is answered all wrong
        yield Item(id=f"{'w' if n % 3 == 0 else 'm'}{n:03d}", prompt=f"{n}=", answer="1")


def _sides(kind: str) -> tuple[GroupSampler, GroupSampler]:
    """The pool's side and a worker's side, as a run builds them from its config."""
    cfg = load_config(None, [f"selection.kind={kind}", "rollout.group_size=4"])
    check_selection(cfg)  # preflight knows the new kind
    pool_side = build_sampler(cfg.selection, cfg.rollout, cfg.seed)
    return pool_side, build_sampler(cfg.selection, cfg.rollout, cfg.seed, None, SamplingParams())


def test_a_sampler_registered_in_one_file_runs_through_the_real_pool() -> None:
    pool_side, worker_side = _sides("second_look")
    assert isinstance(pool_side, SecondLook) and isinstance(worker_side, SecondLook)
    stream = SampleStream(items_per_batch=2, max_staleness=0)
    backend = InlineBackend(worker_side)
    pool = RolloutPool(backend, stream, _source(), sampler=pool_side)
    pool.start()
    try:
        for step in range(1, 6):
            deadline = time.monotonic() + 60
            while (groups := stream.get_batch(timeout=0.05)) is None:
                pool.raise_if_failed()
                assert time.monotonic() < deadline, "no batch"
            assert len(groups) == 2
            if step < 5:  # no publish after the last batch: nothing is outstanding
                pool.publish({}, step)
                stream.set_trainer_version(step)
    finally:
        pool.stop()
    stream.close()
    stream.check_accounting()
    s, m = stream.stats, pool.sampler.metrics()
    assert s.consumed == 10 and s.issued == s.consumed + sum(s.filtered.values())
    # each all-wrong prompt is looked at twice, no more; once: its second look is to come
    state, _ = pool.checkpoint()
    wrong = Counter(it.id for cmd in backend.commands for it in cmd.items if it.id[0] == "w")
    assert set(wrong.values()) <= {1, 2} and 2 in wrong.values()
    to_come = {it.id for it in [*state["selection"]["waiting"], *state["items"]]}
    assert {i for i, n in wrong.items() if n == 1} <= to_come
    assert s.filtered["zero_reward_std"] == wrong.total() and m["selection/second_looks"] > 0
    # the plan went with the item, and the worker's side answered on its report
    looks = [p for cmd in backend.commands for _, p in cmd.planned() if p is not None]
    assert len(looks) == m["selection/second_looks"]
    assert sum(r.feedback == "second look" for r in backend.sent) == len(looks)
    assert pool.drawn == s.issued - len(looks)  # a second look draws nothing new
    # its state went into the pool's checkpoint, and a new pool goes on from it
    fresh = RolloutPool(
        InlineBackend(SecondLook()), SampleStream(2, 0), _source(), sampler=SecondLook()
    )
    fresh.restore(state)
    assert fresh.sampler.metrics() == m
    assert [it.id for it in fresh.sampler.waiting] == [it.id for it in pool_side.waiting]


def test_a_kind_or_rule_nobody_registered_is_one_line_naming_the_key() -> None:
    with pytest.raises(PreflightError, match=r"selection\.kind: unknown kind 'third_look'"):
        check_selection(load_config(None, ["selection.kind=third_look"]))
    with pytest.raises(PreflightError, match=r"rollout\.group_sampling: unknown kind 'sobol'"):
        check_group_sampling(load_config(None, ["rollout.group_sampling=sobol"]))
    with pytest.raises(ValueError, match="already registered"):
        register_sampler("second_look")(type("Other", (GroupSampler,), {}))


@pytest.mark.slow
def test_a_run_selects_the_registered_sampler_by_its_config_key(
    tmp_path: Path, tiny_config
) -> None:
    """The session's pool and the workers build it from ``selection.kind`` alone."""
    cfg = tiny_config(*SHORT_RUN, "selection.kind=second_look", "run.name=look")
    summary = run_training(cfg).summary
    ended = summary["stream/consumed"] + summary["stream/filtered"] + summary["stream/failed"]
    assert summary["stream/issued"] == ended and summary["stream/consumed"] == 24
    assert summary["selection/second_looks"] > 0  # a weak policy gets some groups all wrong
    rows = [json.loads(x) for x in (tmp_path / "look" / "metrics.jsonl").read_text().splitlines()]
    assert "selection/second_looks" in rows[-1]

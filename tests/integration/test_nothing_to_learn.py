"""Dynamic sampling cannot spin silently: after ``algorithm.max_dropped_in_a_row`` generated
groups in a row were dropped for equal rewards, the run stops with an error that says so
(a consumed group resets the count; an item the likelihood gate skipped, never generated,
does not count)."""

from __future__ import annotations

import itertools
import time

import pytest

from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import Item
from streamrl.run.session import run_training
from streamrl.stream.backends import RolloutPool
from streamrl.stream.books import EpisodesFailing, NothingToLearn
from streamrl.stream.sample_stream import SampleStream
from tests.unit.rollout.test_selection import ScriptedBackend


class _Graded(ScriptedBackend):
    """'right*' items: all 4 samples right (reward 1, dropped); 'wrong*': all wrong
    (reward 0, dropped); 'skip*': skipped by the gate; the others mixed (consumed)."""

    def report(self, it: Item) -> GroupDone | GroupRejected:
        if it.id.startswith(("right", "wrong")):
            r = 1.0 if it.id.startswith("right") else 0.0
            return GroupRejected(it.index, "filtered", "zero_reward_std", "", 4 * r, 4)
        if it.id.startswith("skip"):
            return GroupRejected(it.index, "filtered", "predicted_all_correct")
        return GroupDone(it.index, (), 2.0, 4, rewards=(1.0, 1.0, 0.0, 0.0))


def _drain(ids: list[str], limit: int) -> tuple[RolloutPool, SampleStream]:
    """A pool over ``ids`` (then 'right' forever) until it fails or 3 batches of 2 pass."""
    items = (Item(id=k, prompt="q", answer="1") for k in itertools.chain(ids, _right()))
    stream = SampleStream(items_per_batch=2, max_staleness=0)
    pool = RolloutPool(_Graded(), stream, items, max_dropped_in_a_row=limit)
    pool.start()
    try:
        deadline = time.monotonic() + 30
        for step in range(1, 4):
            while stream.get_batch(timeout=0.02) is None:
                pool.raise_if_failed()
                assert time.monotonic() < deadline, "neither a batch nor an error"
            pool.publish({}, step)
            stream.set_trainer_version(step)
    finally:
        pool.stop()
    return pool, stream


def _right():
    for n in itertools.count():
        yield f"right{n}"


def test_groups_dropped_in_a_row_stop_the_run_with_a_clear_error() -> None:
    # 4 dropped, a consumed one resets; 4 skipped by the gate do not count; then only
    # all-right groups: the 5th in a row stops the run (after the first batch)
    ids = ["wrong0", "right0", "wrong1", "right1", "mixed0", "mixed1"]
    ids += ["skip0", "right2", "skip1", "skip2", "right3", "skip3"]
    with pytest.raises(NothingToLearn) as caught:
        _drain(ids, limit=5)
    message = str(caught.value)
    assert message.startswith("5 groups in a row were dropped for equal rewards")
    assert "mean reward 1.000" in message and "max_dropped_in_a_row=5" in message
    assert isinstance(caught.value, EpisodesFailing)  # a user error, not a bug (cli)
    # ten all-wrong groups, then mixed ones: stopped at the 10th, or with the guard off
    # (0), three batches after them
    ids = [f"wrong{i}" for i in range(10)] + [f"mixed{i}" for i in range(6)]
    with pytest.raises(NothingToLearn, match="^10 groups in a row.*mean reward 0.000"):
        _drain(ids, limit=10)
    _, stream = _drain(ids, limit=0)
    assert stream.stats.consumed == 6 and stream.stats.filtered["zero_reward_std"] >= 10


def test_a_run_whose_task_is_too_hard_fails_fast_and_says_why(tiny_config) -> None:
    """A policy that answers no 3-digit product right: every group is dropped, and the run
    stops after 40 of them instead of generating forever."""
    cfg = tiny_config(
        "data.options={digits: 3, operators: '*', heldout_size: 8}",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "train.items_per_step=4",
        "train.steps=3",
        "algorithm.max_dropped_in_a_row=40",
        "run.name=hard",
    )
    with pytest.raises(NothingToLearn, match="40 groups in a row .* mean reward 0.000"):
        run_training(cfg)

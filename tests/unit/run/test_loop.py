"""The RL loop alone, with fakes: the order of a step (wait, update, publish, hooks),
admission closed before the last publish only, a stop asked for by a hook, and the
pool stopped whatever happens."""

from __future__ import annotations

import pytest

from streamrl.run.hooks import Decision, Hooks, StepHook
from streamrl.run.hooks.base import POLL_S
from streamrl.run.loop import RLLoop
from tests.unit.run.fakes import FakeAlgo, FakePool, FakeRecorder, FakeStream, FakeTrainer


class Recording(StepHook):
    """Notes each call in the shared log; stops after ``stop_at``; asks ``poll_s``."""

    def __init__(self, log: list, stop_at: int = 0, poll_s: float | None = None) -> None:
        self.log, self.stop_at, self.poll_s = log, stop_at, poll_s

    def on_start(self) -> None:
        self.log.append(("on_start",))

    def while_waiting(self, step: int) -> float | None:
        self.log.append(("while_waiting", step))
        return self.poll_s

    def before_update(self, step: int) -> None:
        self.log.append(("before_update", step))

    def after_publish(self, step: int) -> None:
        self.log.append(("after_publish", step))

    def after_step(self, step: int, row: dict) -> Decision:
        self.log.append(("after_step", step, row["step"]))
        return Decision.STOP if step == self.stop_at else Decision.CONTINUE

    def on_end(self) -> None:
        self.log.append(("on_end",))


def _loop(log: list, hooks: list, steps: int = 3, polls: int = 1) -> RLLoop:
    return RLLoop(
        FakePool(log),
        FakeStream(log, polls),
        FakeTrainer(log),
        FakeAlgo(log),
        FakeRecorder(),
        Hooks(hooks),
        steps,
        {"num_minibatches": 2, "epochs": 3},
    )


def _step_calls(step: int, last: bool = False) -> list[tuple]:
    return [
        ("raise_if_failed",),
        ("while_waiting", step),
        ("get_batch",),
        ("before_update", step),
        ("prepare",),
        ("train_batch", {"num_minibatches": 2, "epochs": 3}),
        *([("admit", False)] if last else []),
        ("publish", step),
        ("set_trainer_version", step),
        ("after_publish", step),
        ("after_step", step, float(step)),
    ]


def test_a_run_is_wait_update_publish_per_step_in_order() -> None:
    log: list = []
    last, row = _loop(log, [Recording(log)]).run(0)
    assert (last, row["step"], row["loss"]) == (3, 3.0, 0.5)
    assert {"time/step", "time/wait_batch", "time/update", "time/sync"} <= set(row)
    expected = [("start",), ("on_start",), ("wait_version", 0)]
    expected += _step_calls(1) + _step_calls(2) + _step_calls(3, last=True)
    expected += [("stop",), ("close",), ("on_end",)]
    assert log == expected


def test_a_resumed_run_continues_after_its_version() -> None:
    log: list = []
    last, _ = _loop(log, [Recording(log)], steps=5).run(3)
    assert last == 5
    assert ("wait_version", 3) in log
    assert [c[1] for c in log if c[0] == "publish"] == [4, 5]
    assert log.count(("admit", False)) == 1 and log.index(("admit", False)) < log.index(
        ("publish", 5)
    )


def test_a_hook_that_says_stop_ends_the_run_after_that_step() -> None:
    log: list = []
    later: list = []
    last, row = _loop(log, [Recording(log, stop_at=2), Recording(later)], steps=5).run(0)
    assert (last, row["step"]) == (2, 2.0)
    assert [c[1] for c in log if c[0] == "publish"] == [1, 2]
    # the hooks after the one that stopped are not asked about that step
    assert [c[1] for c in later if c[0] == "after_step"] == [1]
    assert log[-3:] == [("stop",), ("close",), ("on_end",)]
    assert ("admit", False) not in log  # (the hook that stops closes admission itself)


def test_the_wait_polls_until_a_batch_with_the_shortest_poll_asked_for() -> None:
    log: list = []
    loop = _loop(log, [Recording(log, poll_s=0.5), Recording([], poll_s=0.1)], steps=1, polls=3)
    loop.run(0)
    assert loop.stream.timeouts == [0.1, 0.1, 0.1]
    assert log.count(("raise_if_failed",)) == 3
    quiet = _loop([], [Recording([])], steps=1)  # no hook asks: POLL_S
    quiet.run(0)
    assert quiet.stream.timeouts == [POLL_S]


def test_the_pool_stops_and_the_hooks_end_whatever_a_hook_raises() -> None:
    log: list = []

    class Fails(Recording):
        def before_update(self, step: int) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _loop(log, [Fails(log)]).run(0)
    assert log[-3:] == [("stop",), ("close",), ("on_end",)]
    assert ("publish", 1) not in log

"""Each step hook alone, with a fake pool: what it asks of the pool, what it adds to
the row and the summary, and when it ends the run."""

from __future__ import annotations

import pytest

import streamrl.run.hooks.placement as placement_hook
from streamrl.config import load_config
from streamrl.run.hooks import Decision, Hooks, StepHook
from streamrl.run.hooks.checkpoints import Checkpoints
from streamrl.run.hooks.evaluation import Evaluation, phase_ends
from streamrl.run.hooks.graceful_stop import StopOnRequest
from streamrl.run.hooks.lending import DRIVEN_POLL_S, LENDING_POLL_S, LendCores
from streamrl.run.hooks.placement import CorePlacement
from streamrl.run.hooks.progress import ReportProgress
from streamrl.run.hooks.stop_at_eval import StopAtEval
from streamrl.run.hooks.time_budget import TimeBudget
from streamrl.run.hooks.time_sharing import Sharing, TimeSharing
from streamrl.stream.backends.placement import Placement
from tests.unit.run.fakes import FakePool, FakeStop, FakeStream

CONTINUE, STOP = Decision.CONTINUE, Decision.STOP


def test_hooks_run_in_order_and_a_stop_skips_the_rest() -> None:
    seen: list[str] = []

    class Note(StepHook):
        def __init__(self, name: str, decision: Decision = CONTINUE) -> None:
            self.name, self.decision = name, decision

        def after_step(self, step: int, row: dict) -> Decision:
            seen.append(self.name)
            return self.decision

    assert Hooks([Note("a"), Note("b")]).after_step(1, {}) is CONTINUE
    assert Hooks([Note("c"), Note("d", STOP), Note("e")]).after_step(1, {}) is STOP
    assert seen == ["a", "b", "c", "d"]

    class Bare(StepHook):  # a hook overrides what it needs; the rest are no-ops
        pass

    bare = Bare()
    assert bare.while_waiting(1) is None and bare.after_step(1, {}) is CONTINUE
    bare.on_start(), bare.before_update(1), bare.after_publish(1), bare.on_end()


# ------------------------------------------------------------------ time sharing


@pytest.mark.parametrize("carry_over", [False, True])
def test_time_sharing_stops_generation_while_the_trainer_trains(carry_over: bool) -> None:
    pool, sharing = FakePool(), Sharing(True)
    hook = TimeSharing(pool, sharing, last_step=3, carry_over=carry_over)
    hook.before_update(1)
    finish = [] if carry_over else [("admit", False), ("finish_inflight",)]
    assert pool.calls == [*finish, ("pause_generation",)]
    pool.calls.clear()
    hook.after_publish(1)
    assert pool.calls == [("admit", True), ("resume_generation",)]
    pool.calls.clear()
    hook.after_publish(3)  # the last step: the pool stops next, paused
    assert pool.calls == []


def test_time_sharing_does_nothing_on_cores_of_their_own() -> None:
    pool = FakePool()
    hook = TimeSharing(pool, Sharing(False), last_step=3, carry_over=False)
    hook.before_update(1)
    hook.after_publish(1)
    assert pool.calls == []


# ------------------------------------------------------------------ lending cores


def test_lending_drives_the_engines_while_the_trainer_waits() -> None:
    pool, stream, stop = FakePool(drives=True), FakeStream([]), FakeStop()
    hook = LendCores(pool, stream, stop, Sharing(False), threads=3)
    assert hook.while_waiting(1) == DRIVEN_POLL_S
    assert pool.calls == [("drive_engines", 3)]
    assert not pool.until()  # it drives until a batch is ready or a stop is asked for
    stream.batch = True
    assert pool.until()
    stream.batch, stop.requested = False, True
    assert pool.until()
    pool.drives = False  # driving does not apply (yet): look again soon
    assert hook.while_waiting(1) == LENDING_POLL_S


def test_lending_leaves_time_shared_cores_alone() -> None:
    pool = FakePool(drives=True)
    hook = LendCores(pool, FakeStream([]), FakeStop(), Sharing(True), threads=3)
    assert hook.while_waiting(1) is None and pool.calls == []


# ------------------------------------------------------------------ placement


class _Auto:
    """AutoPlacement's interface: time-share after step 2, back after step 4."""

    def __init__(self) -> None:
        self.seen, self.decision, self.times = 0, "", []

    def observe(self, step_s: float, wait_s: float, update_s: float) -> bool | None:
        self.seen += 1
        self.times.append((step_s, wait_s, update_s))
        if self.seen == 4:
            self.decision = "scripted: disaggregated"
        return {2: True, 4: False}.get(self.seen)


def test_placement_pins_the_trainer_and_follows_auto(monkeypatch) -> None:
    pinned: list = []
    monkeypatch.setattr(placement_hook, "apply_placement", lambda cpus, n: pinned.append((cpus, n)))
    monkeypatch.setattr(placement_hook, "available_cpus", lambda: [0, 1, 2, 3])
    plan = Placement(False, 2, 1, (0, 1), ((2,), (3,)))
    sharing, auto, summary = Sharing(False), _Auto(), {}
    hook = CorePlacement(plan, sharing, auto, summary)
    hook.on_start()
    assert pinned == [((0, 1), 2)]
    flags = []
    for step in range(1, 6):
        row = {"time/step": 2.0 + step, "time/wait_batch": 0.5, "time/update": 1.0}
        assert hook.after_step(step, row) is CONTINUE
        flags.append(row["placement/time_shared"])
    assert flags == [0.0, 1.0, 1.0, 0.0, 0.0]
    assert auto.times[0] == (3.0, 0.5, 1.0)  # the row's times
    assert pinned[1:] == [((0, 1, 2, 3), 4), ((0, 1), 2)]  # every core, then its share
    assert summary == {"placement_auto": "scripted: disaggregated"}
    assert sharing.on is False
    hook.on_end()
    assert pinned[-1] == ((0, 1, 2, 3), 1)


def test_placement_without_pinned_cores_only_sets_thread_counts(monkeypatch) -> None:
    """The local backend (one process) pins nothing: the hook changes torch's thread
    count only, every core's worth while time-shared, and one after the run."""
    pinned: list = []
    monkeypatch.setattr(placement_hook, "apply_placement", lambda cpus, n: pinned.append((cpus, n)))
    monkeypatch.setattr(placement_hook, "available_cpus", lambda: [0, 1, 2])
    plan = Placement(False, 1, 1, None, (None, None))
    sharing, auto = Sharing(False), _Auto()
    hook = CorePlacement(plan, sharing, auto, {})
    hook.on_start()
    for step in range(1, 3):
        hook.after_step(step, {"time/step": 1.0, "time/wait_batch": 0.5, "time/update": 0.2})
    hook.on_end()
    assert pinned == [(None, 1), (None, 3), (None, 1)]
    assert sharing.on is True


# ------------------------------------------------------------------ evaluation


def test_phase_ends_are_the_steps_that_finish_each_phase() -> None:
    # 10 items at 4 per step end in step 3; 0 items, or a phase as long as the run: none
    assert phase_ends({"offline": 10}, 4, 5) == {3: "offline"}
    assert phase_ends({"offline": 8}, 4, 5) == {2: "offline"}
    assert phase_ends({"offline": 0, "long": 20}, 4, 5) == {}
    assert phase_ends({}, 4, 5) == {}


@pytest.mark.parametrize("shared", [False, True])
def test_evaluation_every_n_steps_and_at_phase_ends(shared: bool) -> None:
    pool, summary, tags = FakePool(), {}, []

    def evaluate(tag: str) -> dict[str, float]:
        tags.append(tag)
        return {"eval/accuracy": 0.25, "eval/accuracy/math": 0.5}

    hook = Evaluation(evaluate, pool, Sharing(shared), 2, 6, {3: "offline"}, summary)
    rows = {step: {"loss": 1.0} for step in range(1, 7)}
    for step, row in rows.items():
        assert hook.after_step(step, row) is CONTINUE
    assert tags == ["step 2", "after offline", "step 4"]  # not at the last step: the final one
    assert "eval/accuracy" in rows[2] and "eval/accuracy" not in rows[5]
    assert summary == {"eval_accuracy_after_offline": 0.25, "eval_accuracy_after_offline/math": 0.5}
    quiet = [("pause_generation",), ("resume_generation",)]
    if not shared:  # generation goes on; only work ahead waits
        quiet = [("work_ahead", False), ("work_ahead", True)]
    assert pool.calls == quiet * 3


def test_no_evaluation_without_eval_every_or_a_phase_end() -> None:
    pool, tags = FakePool(), []
    hook = Evaluation(lambda tag: tags.append(tag) or {}, pool, Sharing(False), 0, 4, {}, {})
    rows = [{"loss": 1.0} for _ in range(4)]
    assert all(hook.after_step(s, r) is CONTINUE for s, r in enumerate(rows, 1))
    assert tags == [] and pool.calls == [] and rows == [{"loss": 1.0}] * 4


# ------------------------------------------------------------------ early ends


def test_stop_at_eval_ends_the_run_at_the_threshold() -> None:
    pool, summary = FakePool(), {}
    hook = StopAtEval(pool, 0.5, summary)
    assert hook.after_step(1, {"loss": 1.0}) is CONTINUE  # no evaluation this step
    assert hook.after_step(2, {"eval/accuracy": 0.49}) is CONTINUE
    assert pool.calls == [] and summary == {}
    assert hook.after_step(3, {"eval/accuracy": 0.5}) is STOP
    assert pool.calls == [("admit", False)] and summary == {"stopped_early_at_step": 3}
    # an environment's return decides, not an accuracy in the same row
    assert (
        StopAtEval(FakePool(), 10, {}).after_step(1, {"eval/return": 9, "eval/accuracy": 11})
        is CONTINUE
    )
    assert StopAtEval(FakePool(), None, {}).after_step(1, {"eval/accuracy": 1.0}) is CONTINUE


def test_the_time_budget_ends_the_run_once_spent() -> None:
    pool, summary, spent = FakePool(), {}, [5.0]
    hook = TimeBudget(pool, 10.0, lambda: spent[0], steps=4, summary=summary)
    assert hook.after_step(1, {}) is CONTINUE
    spent[0] = 10.0
    assert hook.after_step(4, {}) is CONTINUE  # the last step ends the run anyway
    assert pool.calls == [] and summary == {}
    assert hook.after_step(2, {}) is STOP
    assert pool.calls == [("admit", False)] and summary == {"stopped_early_at_step": 2}


# ------------------------------------------------------------------ checkpoints and stops


def test_checkpoints_every_n_steps_with_the_books_of_each_step() -> None:
    books, logged, saved, stop = [], [], [], FakeStop()

    def take_books() -> dict:
        books.append(len(books))
        return {"pool": len(books)}

    hook = Checkpoints(
        take_books,
        lambda step, row: logged.append(step),
        lambda step, state: saved.append((step, state)),
        every=2,
        steps=5,
        stop=stop,
    )
    for step in range(1, 6):
        assert hook.after_step(step, {}) is CONTINUE
    assert books == [0, 1, 2, 3, 4]  # every step's ledger, the last one's too
    assert logged == [1, 2, 3, 4]  # the last row waits for the final evaluation
    assert saved == [(2, {"pool": 2}), (4, {"pool": 4})]
    stop.requested = True  # a graceful stop: a checkpoint now, whatever the step
    hook.after_step(3, {})
    assert saved[-1] == (3, {"pool": 6})
    assert (
        Checkpoints(lambda: {}, lambda s, r: None, saved.append, 0, 5, FakeStop()).after_step(4, {})
        is CONTINUE
    )


class _Stopped(Exception):
    pass


def test_a_stop_asked_for_while_waiting_checkpoints_the_step_before() -> None:
    pool, saved, stop = FakePool(), [], FakeStop()
    hook = StopOnRequest(
        stop, pool, 5, lambda: {"pool": 1}, lambda s, st: saved.append((s, st)), _Stopped
    )
    assert hook.while_waiting(3) is None and pool.calls == [] and saved == []
    stop.requested = True
    with pytest.raises(_Stopped) as raised:
        hook.while_waiting(3)
    assert raised.value.args == (2,)
    assert pool.calls == [("admit", False)] and saved == [(2, {"pool": 1})]


def test_a_stop_asked_for_during_a_step_ends_the_run_after_it() -> None:
    pool, stop = FakePool(), FakeStop()
    hook = StopOnRequest(stop, pool, 5, dict, lambda s, st: None, _Stopped)
    assert hook.after_step(3, {}) is CONTINUE
    stop.requested = True
    assert hook.after_step(5, {}) is CONTINUE and pool.calls == []  # the last step: it ends
    with pytest.raises(_Stopped) as raised:
        hook.after_step(3, {})
    assert raised.value.args == (3,) and pool.calls == [("admit", False)]


def test_progress_is_reported_after_each_step() -> None:
    seen = []
    hook = ReportProgress(lambda *a: seen.append(a), steps=4)
    assert hook.after_step(2, {"loss": 1.0}) is CONTINUE
    assert seen == [("rl", 2, 4, {"loss": 1.0})]


# ------------------------------------------------------------------ the session's list


def test_the_session_orders_its_hooks_so_each_sees_what_it_needs(tmp_path) -> None:
    """Placement first (it adds placement/time_shared, the evaluation pauses by it), the
    early ends before the checkpoint (a stopped run writes its final one), the checkpoint
    before the graceful stop (which reports it written), the stop before lending (a stop
    ends the wait before the engines are driven); the monitors after the evaluation
    (they read its accuracy)."""
    from types import SimpleNamespace

    from streamrl.run.rl import RLStage
    from streamrl.sources import build_task_source

    cfg = load_config(
        None,
        ["runtime.lend_cores=true", "stream.max_staleness=1", "run.max_rl_seconds=60"],
    )
    stage = RLStage()
    stage.cfg, stage.summary, stage.stop, stage.progress = cfg, {}, FakeStop(), print
    reward = SimpleNamespace(weights={"numeric_match": 1.0})
    stage.inputs = SimpleNamespace(source=build_task_source("arithmetic"), reward=reward)
    stage.evaluate = lambda tag: {}
    stage.run = SimpleNamespace(metrics=SimpleNamespace(log=print), log=None)
    plan = Placement(False, 1, 1, None, (None,))
    hooks = stage.step_hooks(FakePool(), FakeStream([]), SimpleNamespace(rl_seconds=float), plan)
    names = [type(h).__name__ for h in hooks.hooks]
    assert names == [
        "CorePlacement",
        "TimeSharing",
        "Evaluation",
        "StopAtEval",
        "Monitors",
        "TimeBudget",
        "Checkpoints",
        "StopOnRequest",
        "LendCores",
        "ReportProgress",
    ]

"""How the driver of a rank group on Ray tells a failed rank (no Ray needed: a stand-in
for its ``wait``/``get`` and a hand-driven clock): a rank that leaves its ping unanswered
for ``collective_timeout_s`` is hung, and a follower whose program raised, whatever the
error, failed the group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamrl.engines.train.group.spec import RankGroupFailed
from streamrl.run import pings as ping_rules
from streamrl.run.ray_group import _follower_ended, ray_pings


class Ref:
    def __init__(self, rank: int) -> None:
        self.rank = rank


class FakeRay:
    """``wait`` reports the refs of the ranks in ``answering`` as ready."""

    def __init__(self) -> None:
        self.answering: set[int] = {0, 1}
        self.sent: list[int] = []

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if r.rank in self.answering]
        return ready, [r for r in refs if r.rank not in self.answering]

    def actor(self, rank: int) -> SimpleNamespace:
        def remote() -> Ref:
            self.sent.append(rank)
            return Ref(rank)

        return SimpleNamespace(ready=SimpleNamespace(remote=remote))


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ping_rules.time, "monotonic", lambda: now[0])
    return now


def test_a_rank_silent_for_the_timeout_is_hung(clock) -> None:
    ray = FakeRay()
    pings = ray_pings(ray, [ray.actor(0), ray.actor(1)], timeout_s=20.0)  # a round every 5 s
    clock[0] = 104.0
    pings.check()
    assert ray.sent == []  # not yet due
    clock[0] = 105.0
    pings.check()
    assert ray.sent == [0, 1]
    pings.check()  # both answered: the round is over
    clock[0] = 109.0
    pings.check()
    assert ray.sent == [0, 1]  # the next round is due at 110
    clock[0] = 110.0
    ray.answering = {1}  # rank 0 stops answering
    pings.check()
    assert ray.sent == [0, 1, 0, 1]
    for t in (115.0, 125.0, 130.0):  # waiting up to the timeout is no failure
        clock[0] = t
        pings.check()
    assert ray.sent == [0, 1, 0, 1]  # no new round while one is unanswered
    clock[0] = 130.5
    with pytest.raises(RankGroupFailed, match=r"rank\(s\) \[0\] answered no ping for 20s"):
        pings.check()


def test_a_late_answer_within_the_timeout_is_no_failure(clock) -> None:
    ray = FakeRay()
    pings = ray_pings(ray, [ray.actor(0), ray.actor(1)], timeout_s=8.0)  # a round every 2 s
    ray.answering = set()
    clock[0] = 102.0
    pings.check()
    clock[0] = 109.9
    pings.check()
    ray.answering = {0, 1}
    clock[0] = 200.0  # answered: the round is over, however late it is read
    pings.check()


class TaskError(Exception):
    """Ray's wrapper: ``cause`` is the rank's own exception."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause

    def as_instanceof_cause(self) -> BaseException:
        return RuntimeError(f"ray::RankActor.serve() (pid=1)\n{self.cause!r}")


@pytest.mark.parametrize(
    "cause",
    [
        RuntimeError("[gloo] Connection closed by peer\nException raised from recv"),
        ValueError("a follower's own bug"),  # not a collective's words: still a rank failure
        MemoryError(),
    ],
)
def test_a_follower_that_raised_failed_the_group(cause: BaseException) -> None:
    def get(ref):
        raise TaskError(cause)

    ray = SimpleNamespace(get=get, exceptions=SimpleNamespace(RayTaskError=TaskError))
    with pytest.raises(RankGroupFailed, match=r"^rank 3 failed \(") as e:
        _follower_ended(ray, 3, object())
    first = (str(cause).splitlines() or [""])[0]  # the rank's own message, not Ray's wrapper
    assert str(e.value) == f"rank 3 failed ({type(cause).__name__}: {first})"


def test_a_follower_released_by_rank_0_is_no_failure() -> None:
    ray = SimpleNamespace(get=lambda ref: None, exceptions=SimpleNamespace(RayTaskError=TaskError))
    _follower_ended(ray, 1, object())

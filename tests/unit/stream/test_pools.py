"""One pool interface: both pools implement every member of :class:`Pool`, and the
flow-control words mean the same on each (admission, paused generation, work ahead,
finishing what was admitted)."""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path

import pytest

from streamrl.core.messages import Pause, Resume, StartItems
from streamrl.models.tokenizer import build_char_tokenizer
from streamrl.rollout.selection import GroupSampler
from streamrl.run.assembly import rollout_spec
from streamrl.stream.endpoint.pool import EndpointPool
from streamrl.stream.pool import RolloutPool
from streamrl.stream.pools import Pool
from streamrl.stream.sample_stream import SampleStream
from tests.endpoint_harness import ScriptedEngine, endpoint_cfg
from tests.unit.rollout.test_selection import ScriptedBackend, _keys
from tests.unit.run.fakes import FakePool


def _pools(tmp_path: Path) -> dict[str, object]:
    cfg = endpoint_cfg(tmp_path)
    endpoint = EndpointPool(
        cfg.endpoint,
        rollout_spec(cfg),
        None,
        build_char_tokenizer(),
        {},
        0,
        SampleStream(1, 0),
        tmp_path,
        engine=ScriptedEngine(build_char_tokenizer()),
    )
    rollout = RolloutPool(ScriptedBackend(), SampleStream(2, 0), _keys())
    return {"rollout": rollout, "endpoint": endpoint, "fake": FakePool()}


@pytest.mark.parametrize("kind", ["rollout", "endpoint", "fake"])
def test_each_pool_implements_the_whole_interface(tmp_path: Path, kind: str) -> None:
    pool = _pools(tmp_path)[kind]
    methods = [n for n, _ in inspect.getmembers(Pool, inspect.isfunction) if n[0] != "_"]
    assert {"admit", "pause_generation", "resume_generation", "work_ahead"} <= set(methods)
    assert {"finish_inflight", "drive_engines", "checkpoint", "restore"} <= set(methods)
    assert isinstance(pool, Pool)  # every method and every counter is there
    for name in methods:
        assert callable(getattr(pool, name)), name
    for name in Pool.__annotations__:
        assert isinstance(getattr(pool, name), int | dict | GroupSampler), name


class _Recording(ScriptedBackend):
    def __init__(self) -> None:
        super().__init__()
        self.commands: list = []

    def send(self, worker: int, command) -> None:
        self.commands.append(command)
        super().send(worker, command)


def test_the_rollout_pool_admits_pauses_and_finishes_on_request() -> None:
    stream = SampleStream(items_per_batch=2, max_staleness=1)
    backend = _Recording()
    pool = RolloutPool(backend, stream, _keys())
    pool.admit(False)
    pool.start()
    try:
        pool.wait_version(0, timeout=30)
        time.sleep(0.05)
        assert not any(isinstance(c, StartItems) for c in backend.commands)  # none admitted
        pool.pause_generation()
        pool.resume_generation()
        assert [type(c) for c in backend.commands] == [Pause, Resume]
        assert pool.drive_engines(1, lambda: True) is False  # its engines are elsewhere
        pool.admit(True)
        deadline = time.monotonic() + 30
        while stream.stats.issued < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.admit(False)
        pool.finish_inflight()  # every admitted item has been reported
        assert not any(pool.inflight)
        issued = stream.stats.issued
        time.sleep(0.05)
        assert stream.stats.issued == issued >= 2  # nothing admitted since
    finally:
        pool.stop()
        stream.close()


class _PausableEngine(ScriptedEngine):
    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.paused: list[bool] = []

    def pause(self) -> None:
        self.paused.append(True)

    def resume(self) -> None:
        self.paused.append(False)


def test_the_endpoint_pool_speaks_the_same_words(tmp_path: Path) -> None:
    engine = _PausableEngine(build_char_tokenizer())
    stream = SampleStream(1, 0)
    cfg = endpoint_cfg(tmp_path)
    tok = build_char_tokenizer()
    spec = rollout_spec(cfg)
    pool = EndpointPool(cfg.endpoint, spec, None, tok, {}, 0, stream, tmp_path, engine=engine)
    pool.admit(False)  # (the session table admits nothing while it is off)
    assert pool._hold
    pool.admit(True)
    assert not pool._hold
    pool.pause_generation()
    pool.resume_generation()
    assert engine.paused == [True, False]
    pool.work_ahead(False)  # nothing is worked ahead here: a no-op
    pool._active_calls = 1  # a call is being generated
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (pool.finish_inflight(), done.set()))
    waiter.start()
    assert not done.wait(0.05)
    pool._active_calls = 0
    assert done.wait(10)
    waiter.join()
    stream.close()


def test_dropped_groups_come_back_by_item_index_with_their_answer_once() -> None:
    """A filtered group whose worker sent its samples (the algorithm wants dropped groups)
    is kept with its item's reference answer, handed back sorted by item index whatever
    the order they finished in, once; one sent without samples is not kept."""
    from streamrl.core.messages import GroupRejected
    from streamrl.stream.books import PoolBooks

    books = PoolBooks()
    sample = object()
    for index, answer in ((7, "3"), (2, None), (5, "x")):
        books.note_dropped_group(
            GroupRejected(index, "filtered", "zero_reward_std", samples=(sample,)), answer
        )
    books.note_dropped_group(GroupRejected(9, "filtered", "zero_reward_std"), "4")
    assert [g.item_index for g in books.dropped_state()] == [7, 2, 5]  # the checkpoint's
    taken = books.take_dropped()
    assert [(g.item_index, g.answer, g.samples) for g in taken] == [
        (2, None, [sample]),
        (5, "x", [sample]),
        (7, "3", [sample]),
    ]
    assert books.take_dropped() == []
    books.restore_dropped(taken[:1])
    assert [g.item_index for g in books.take_dropped()] == [2]

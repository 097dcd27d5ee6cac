"""The endpoint's sessions: one item per session however many calls race to open it,
every admitted item ends exactly once (consumed, filtered or failed with a reason), and a
stop leaves nothing waiting. The table alone (asyncio, a real stream), then a real run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

import httpx
import pytest

from streamrl.core.messages import GroupRejected
from streamrl.run.launch import train
from streamrl.stream.endpoint.openai_format import EndpointError
from streamrl.stream.endpoint.sessions import SessionTable
from streamrl.stream.sample_stream import SampleStream
from tests.endpoint_harness import endpoint_cfg, served, wait_endpoint


def _table(stream: SampleStream) -> SessionTable:
    def end(msg: GroupRejected) -> None:
        stream.reject(msg.item_index, msg.outcome, msg.reason)

    return SessionTable(stream, lambda: 0, lambda: False, end)


async def _with_admitter(table: SessionTable, body) -> None:
    admitter = asyncio.create_task(table.admit_forever())
    try:
        await body()
    finally:
        admitter.cancel()
        table.stop()


async def _call(table: SessionTable, sid: str, hold: asyncio.Event | None = None) -> int:
    async with table.call(sid) as s:
        if hold is not None:
            await hold.wait()
        return s.item_index


def test_concurrent_first_calls_of_one_session_share_one_item() -> None:
    stream = SampleStream(2, 1)  # room for 4 items: a leak would take more than one
    table = _table(stream)

    async def body() -> None:
        got = await asyncio.gather(*(_call(table, "s") for _ in range(32)))
        assert got == [0] * 32
        assert stream.stats.issued == 1 and table.counts["sessions"] == 1
        assert await _call(table, "t") == 1  # the next session gets the next item

    asyncio.run(_with_admitter(table, body))
    stream.check_accounting()


def test_items_admitted_for_no_one_are_released_and_counted() -> None:
    stream = SampleStream(1, 0)  # one item at a time
    table = _table(stream)

    async def body() -> None:
        hold = asyncio.Event()
        first = asyncio.create_task(_call(table, "a", hold))
        await asyncio.sleep(0.2)
        assert stream.stats.issued == 1
        # "b" waits; its only caller leaves before it is admitted: it is forgotten
        waiting = asyncio.create_task(_call(table, "b"))
        await asyncio.sleep(0.2)
        assert table.waiting == 1
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert table.waiting == 0 and "b" not in table.sessions
        assert table.counts["sessions_abandoned"] == 1
        await asyncio.sleep(0.2)  # the admission being asked for then has given up
        hold.set()
        assert await first == 0
        stream.reject(0, "failed", "test")  # room for one more: nobody takes it
        await asyncio.sleep(0.2)
        assert stream.stats.issued == 1
        # an item the stream admitted as the last waiter left is rejected, with a reason
        (index,) = stream.admit(0, 1)
        table._assign(index)
        assert stream.stats.failed["session_abandoned"] == 1

    asyncio.run(_with_admitter(table, body))
    stream.check_accounting()
    assert stream.outstanding() == 0


def test_stop_refuses_the_waiting_sessions_and_counts_them() -> None:
    stream = SampleStream(1, 0)
    table = _table(stream)

    async def body() -> None:
        hold = asyncio.Event()
        admitted = asyncio.create_task(_call(table, "a", hold))
        await asyncio.sleep(0.2)
        waiting = [asyncio.create_task(_call(table, f"w{k}")) for k in range(3)]
        joined = asyncio.create_task(_call(table, "w0"))  # a second call of a waiting one
        await asyncio.sleep(0.2)
        table.stop()
        for task in [*waiting, joined]:
            with pytest.raises(EndpointError, match="the run has ended"):
                await task
        with pytest.raises(EndpointError, match="the run has ended"):
            await _call(table, "late")
        assert table.counts["sessions_refused"] == 4 and table.waiting == 0
        hold.set()
        assert await admitted == 0  # an admitted session keeps its item until the end

    asyncio.run(_with_admitter(table, body))
    assert stream.stats.issued == 1
    stream.close()  # the run's end counts the open session
    assert stream.stats.filtered["run_ended"] == 1
    stream.check_accounting()


def test_expiry_and_rewards_wait_for_calls_in_progress(tmp_path: Path) -> None:
    cfg = endpoint_cfg(tmp_path)
    with served(cfg, tmp_path, stream=SampleStream(4, 0)) as pool:
        auth = {"Authorization": f"Bearer {pool.token}"}
        reward_url = f"{pool.base_url}/sessions/s/reward"
        table = pool.table

        async def body() -> None:
            hold = asyncio.Event()
            call = asyncio.create_task(_call(table, "s", hold))
            await asyncio.sleep(0.2)
            assert table.expire(0.0) == []  # a call in progress: not idle
            r = await asyncio.to_thread(httpx.post, reward_url, json={"reward": 1}, headers=auth)
            assert r.status_code == 409 and "in progress" in r.text
            hold.set()
            await call
            assert table.expire(0.0) == ["s"]  # idle now: failed, session_timeout

        asyncio.run_coroutine_threadsafe(body(), table._loop).result(60)
        assert pool.stream.stats.failed["session_timeout"] == 1


def test_a_session_hammered_by_concurrent_first_calls_does_not_wedge_training(
    tmp_path: Path,
) -> None:
    """32 concurrent first calls with one session id, another session beside it: one
    item each; both rewarded, training goes on to later steps and takes a new session."""
    cfg = endpoint_cfg(
        tmp_path, "stream.max_staleness=1", "train.steps=3", "rollout.max_new_tokens=2"
    )
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("result", train(cfg)), daemon=True)
    runner.start()
    base, token = wait_endpoint(tmp_path / "served", runner)
    auth = {"Authorization": f"Bearer {token}"}

    def chat(session: str) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": "1+2="}], "session_id": session}
        return httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=120)

    def reward(session: str, n: int) -> httpx.Response:
        rewards = [float(k % 2) for k in range(n)]
        url = f"{base}/sessions/{session}/reward"
        return httpx.post(url, json={"rewards": rewards}, headers=auth, timeout=120)

    replies: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: replies.append(chat("w"))) for _ in range(32)]
    threads.append(threading.Thread(target=lambda: replies.append(chat("x"))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r.status_code for r in replies] == [200] * 33
    assert reward("w", 32).status_code == 200  # all 32 calls recorded in one session
    assert reward("x", 1).status_code == 200
    # a new session is admitted once step 1 frees room, and the run trains to the end
    assert chat("y").status_code == 200
    assert reward("y", 1).status_code == 200
    runner.join(180)
    assert not runner.is_alive(), "training stopped"
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["stream/issued"] == summary["stream/consumed"] == 3  # no item leaked

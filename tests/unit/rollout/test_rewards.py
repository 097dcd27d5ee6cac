"""Reward functions, their composition, and the guard that isolates failures and hangs."""

from __future__ import annotations

import asyncio
import doctest
import os
import signal
import threading
import time

import pytest

import streamrl.rollout.rewards.functions
import streamrl.rollout.rewards.guard
import streamrl.rollout.rewards.llm_judge
import streamrl.rollout.rewards.registry
import streamrl.rollout.rewards.reward_model
from streamrl.config import RewardComponent, RewardConfig
from streamrl.core.types import Item
from streamrl.rollout.rewards import (
    ANSWER_TAG_PATTERN,
    CompositeReward,
    RewardGuard,
    build_reward,
    exact_match,
    format_reward,
    get_reward,
    math_verify,
    numeric_match,
)
from tests import hostile_rewards

ITEM = Item(id="q", prompt="12+34=", answer="46")
RELEASE = threading.Event()  # hung test rewards wait on this; set at the end of each test


@pytest.fixture(autouse=True)
def _release_hung_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


def hang(completion: str, item: Item) -> float:
    """A reward that never returns (until the test releases it)."""
    RELEASE.wait()
    return 0.0


def boom(completion: str, item: Item) -> float:
    raise ValueError(f"cannot grade {completion!r}")


@pytest.mark.parametrize(
    "module",
    [
        streamrl.rollout.rewards.functions,
        streamrl.rollout.rewards.registry,
        streamrl.rollout.rewards.guard,
        streamrl.rollout.rewards.reward_model,
        streamrl.rollout.rewards.llm_judge,
    ],
)
def test_doctests(module: object) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_exact_and_numeric_match() -> None:
    assert exact_match("  46\n", ITEM) == 1.0
    assert exact_match("46.", ITEM) == 0.0
    assert exact_match("the  CAPITAL", Item(id="c", prompt="?", answer="The capital")) == 1.0
    assert numeric_match("First 12, then 46", ITEM) == 1.0
    assert numeric_match("46 then 12", ITEM) == 0.0
    assert numeric_match("1,234", Item(id="x", prompt="?", answer="1234")) == 1.0
    assert numeric_match("= -4", Item(id="x", prompt="?", answer="-4")) == 1.0
    assert numeric_match("0.3333", Item(id="x", prompt="?", answer="0.33333"), tol=1e-3) == 1.0
    with pytest.raises(ValueError, match="not a number"):
        numeric_match("46", Item(id="x", prompt="?", answer="Paris"))
    with pytest.raises(ValueError, match="no reference answer"):
        exact_match("46", Item(id="x", prompt="?"))


def test_math_verify_in_a_worker_thread() -> None:
    item = Item(id="m", prompt="?", answer="\\frac{1}{2}")
    results: list[float] = []
    t = threading.Thread(target=lambda: results.extend([math_verify("$0.5$", item)]))
    t.start()
    t.join()
    assert results == [1.0]  # no "signal only works in main thread" error
    assert math_verify("The answer is \\boxed{46}.", ITEM) == 1.0
    assert math_verify("it is 45", ITEM) == 0.0


def test_format_reward() -> None:
    assert format_reward("-12", ITEM) == 1.0
    assert format_reward("12 apples", ITEM) == 0.0
    assert format_reward("hmm <answer>46</answer>", ITEM, pattern=ANSWER_TAG_PATTERN) == 1.0
    assert format_reward("46", ITEM, pattern=ANSWER_TAG_PATTERN) == 0.0
    tagged = get_reward("format_reward", pattern=ANSWER_TAG_PATTERN)
    assert tagged("<answer>x</answer>", ITEM) == 1.0
    with pytest.raises(
        ValueError, match=r"unknown reward 'nope'; known: .*\bexact_match\b.*\bmajority_vote\b"
    ):
        get_reward("nope")


def test_composite_weights_and_components() -> None:
    reward = CompositeReward(
        [
            ("numeric_match", 1.0),
            ("format_reward", 0.5),
            (exact_match, 2.0),
            ("format_reward", 1.0),
        ],
        timeout_s=5.0,
    )
    try:
        result = reward("46", ITEM)
        assert result.ok and result.total == 1.0 + 0.5 + 2.0 + 1.0
        assert list(result.components) == [
            "numeric_match",
            "format_reward",
            "exact_match",
            "format_reward#2",
        ]
        result = reward("so 46", ITEM)
        assert result.total == 1.0
        assert result.components == {
            "numeric_match": 1.0,
            "format_reward": 0.0,
            "exact_match": 0.0,
            "format_reward#2": 0.0,
        }
    finally:
        reward.close()


def test_raising_reward_is_recorded() -> None:
    reward = CompositeReward([("numeric_match", 1.0), (boom, 1.0)], timeout_s=5.0)
    result = reward("46", ITEM)
    assert result.total is None and not result.ok
    assert result.components == {"numeric_match": 1.0, "boom": None}
    assert result.errors["boom"].startswith("ValueError: cannot grade '46' (test_rewards.py:")
    zero = CompositeReward([("numeric_match", 1.0), (boom, 1.0)], timeout_s=5.0, on_error="zero")
    result = zero("46", ITEM)
    assert result.total == 1.0 and "boom" in result.errors
    reward.close()
    zero.close()


def test_bad_return_values_are_recorded() -> None:
    with RewardGuard(1.0) as guard:
        assert (
            guard.call(lambda c, i: float("nan"), "x", ITEM).error
            == "ValueError: reward returned nan"
        )
        assert guard.call(lambda c, i: None, "x", ITEM).error.startswith(
            "TypeError: reward returned"
        )
        assert guard.call(lambda c, i: True, "x", ITEM).value == 1.0


def test_hanging_reward_times_out_promptly() -> None:
    reward = CompositeReward([("numeric_match", 1.0), (hang, 1.0)], timeout_s=0.3)
    start = time.monotonic()
    result = reward("46", ITEM)
    assert time.monotonic() - start < 2.0
    assert result.total is None and result.errors == {"hang": "timeout after 0.3s"}
    assert result.components == {"numeric_match": 1.0, "hang": None}
    # the pool replaced the hung worker: normal calls still work
    assert reward.guard.call(numeric_match, "46", ITEM).value == 1.0
    assert reward.guard.stats()["timeouts"] == 1
    reward.close()


def test_async_variant_does_not_block_the_loop() -> None:
    reward = CompositeReward([(hang, 1.0)], timeout_s=0.3)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def main() -> list:
        task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(reward.ascore("x", ITEM) for _ in range(3)))
        task.cancel()
        return results

    start = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - start < 2.0 and ticks >= 5
    assert all(r.errors == {"hang": "timeout after 0.3s"} for r in results)
    reward.close()


def test_threads_stay_bounded() -> None:
    before = threading.active_count()
    guard = RewardGuard(0.2, max_workers=2, max_hung=2)
    futures = [guard.submit(numeric_match, "46", ITEM) for _ in range(300)]
    assert all(guard.outcome(f).value == 1.0 for f in futures)
    assert threading.active_count() <= before + 2 + 1  # workers + watchdog
    start = time.monotonic()
    outcomes = [guard.call(hang, "x", ITEM) for _ in range(6)]
    assert time.monotonic() - start < 6 * 0.2 + 2.0
    assert threading.active_count() <= before + 2 + 2 + 1  # + at most max_hung abandoned
    assert [o.error for o in outcomes[:4]] == ["timeout after 0.2s"] * 4
    # Every worker is hung and none may be added: calls fail at once instead of queueing.
    assert outcomes[-1].error.startswith("no reward worker available")
    RELEASE.set()  # the hung calls return; their threads exit and the pool recovers
    deadline = time.monotonic() + 2.0
    while guard.stats()["hung_workers"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.call(numeric_match, "46", ITEM).value == 1.0
    guard.close()


def _process_guard(timeout_s: float, **kwargs) -> RewardGuard:
    """A one-worker process guard, started (so worker start-up is not charged to a call)."""
    guard = RewardGuard(timeout_s, backend="process", max_workers=1, **kwargs)
    guard.start()
    return guard


def _pid(guard: RewardGuard) -> float:
    outcome = guard.call(hostile_rewards.worker_pid, "x", ITEM)
    assert outcome.ok, outcome.error
    return outcome.value


@pytest.mark.slow
def test_process_backend_kills_hung_workers() -> None:
    with _process_guard(2.0, preload=("json",)) as guard:
        assert guard.call(numeric_match, "46", ITEM).value == 1.0
        # (the first call naming a test function also imports this module in the worker)
        assert guard.call(boom, "x", ITEM).error.startswith("ValueError: cannot grade 'x'")
        assert "pickle" in guard.call(lambda c, i: 1.0, "x", ITEM).error  # (not importable)
        pid = _pid(guard)
        start = time.monotonic()
        assert guard.call(hang, "x", ITEM).error == "timeout after 2.0s"
        assert time.monotonic() - start < 30.0  # (it did not wait for the reward)
        assert guard.call(numeric_match, "46", ITEM).value == 1.0  # on a fresh worker
        assert _pid(guard) != pid


@pytest.mark.slow
@pytest.mark.parametrize("reward", [hostile_rewards.sleep_forever, hostile_rewards.spin_forever])
def test_process_isolation_kills_a_hung_reward(reward) -> None:
    with _process_guard(0.5) as guard:
        pid = _pid(guard)
        start = time.monotonic()
        assert guard.call(reward, "x", ITEM).error == "timeout after 0.5s"
        assert time.monotonic() - start < 30.0  # (generous: it did not wait for the reward)
        assert guard.call(numeric_match, "46", ITEM).value == 1.0
        assert _pid(guard) != pid  # the hung worker was killed and replaced
        assert guard.stats() == {"calls": 4, "failures": 1, "timeouts": 1, "hung_workers": 0}


@pytest.mark.slow
def test_process_isolation_survives_a_segfault() -> None:
    with _process_guard(5.0) as guard:
        pid = _pid(guard)
        assert guard.call(hostile_rewards.segfault, "x", ITEM).error == (
            "reward worker died (SIGSEGV)"
        )
        assert guard.call(numeric_match, "46", ITEM).value == 1.0
        assert _pid(guard) != pid
        # and several crashes in a row, with calls queued behind them
        futures = [guard.submit(hostile_rewards.segfault, "x", ITEM) for _ in range(3)]
        futures.append(guard.submit(numeric_match, "46", ITEM))
        outcomes = [guard.outcome(f) for f in futures]
        assert [o.error for o in outcomes[:3]] == ["reward worker died (SIGSEGV)"] * 3
        assert outcomes[3].value == 1.0
        assert guard.call(hostile_rewards.text, "x", ITEM).error == (
            "TypeError: reward returned str, expected a float"
        )


@pytest.mark.slow
def test_process_isolation_survives_memory_leaks_and_huge_allocations() -> None:
    with _process_guard(10.0, memory_limit_mb=256) as guard:
        # every call keeps 64 MB more alive in the worker, until the limit stops it
        values = []
        for _ in range(20):
            outcome = guard.call(hostile_rewards.leak, "x", ITEM)
            if not outcome.ok:
                break
            values.append(outcome.value)
        assert values == [float(n) for n in range(1, len(values) + 1)] and len(values) <= 4
        assert outcome.error == "MemoryError: reward went past the worker memory limit (256 MB)"
        # the worker (and its leak) is gone: a fresh one starts from an empty list
        assert guard.call(hostile_rewards.leak, "x", ITEM).value == 1.0
        assert guard.call(hostile_rewards.allocate_huge, "x", ITEM).error.startswith("MemoryError")
        assert guard.call(numeric_match, "46", ITEM).value == 1.0


@pytest.mark.slow
def test_process_guard_replaces_a_pool_broken_by_an_idle_worker_dying() -> None:
    # pebble gives up on its pool when a worker dies while idle (say, the OOM killer)
    with _process_guard(5.0, max_queue_wait_s=10.0) as guard:
        os.kill(int(_pid(guard)), signal.SIGKILL)
        for _ in range(5):  # a call racing the pool's breakdown may fail; a later one works
            if (outcome := guard.call(numeric_match, "46", ITEM)).ok:
                break
        assert outcome.value == 1.0


@pytest.mark.slow
def test_build_reward_selects_the_isolation_from_config() -> None:
    components = [RewardComponent(name="numeric_match"), RewardComponent(name="format_reward")]
    thread = build_reward(RewardConfig(components=components, timeout_s=2.0))
    assert thread.guard.backend == "thread"
    assert thread("46", ITEM).total == 2.0
    thread.close()
    cfg = RewardConfig(
        components=components, timeout_s=2.0, isolation="process", memory_limit_mb=512
    )
    reward = build_reward(cfg)
    try:
        assert reward.guard.backend == "process" and reward.guard.memory_mb == 512
        assert reward.guard.timeout_s == 2.0
        result = reward("46", ITEM)
        assert result.ok and result.total == 2.0
        result = asyncio.run(reward.ascore("so 46", ITEM))
        assert result.components == {"numeric_match": 1.0, "format_reward": 0.0}
    finally:
        reward.close()
    with pytest.raises(RuntimeError, match="closed"):
        reward.guard.call(numeric_match, "46", ITEM)


def test_process_isolation_needs_picklable_components() -> None:
    with pytest.raises(ValueError, match="'<lambda>' cannot run in a worker process"):
        CompositeReward([(lambda c, i: 1.0, 1.0)], isolation="process")
    # names and module-level functions with options are fine (and nothing starts yet)
    reward = CompositeReward(
        [
            ("format_reward", 1.0, {"pattern": ANSWER_TAG_PATTERN}),
            (hostile_rewards.leak, 0, {"mb": 1}),
        ],
        isolation="process",
    )
    reward.close()


# ----------------------------------------------------------------------------- domains


def _in(domain: str | None, answer: str = "46") -> Item:
    return Item(
        id="d", prompt="?", answer=answer, metadata={} if domain is None else {"domain": domain}
    )


def test_components_score_only_the_items_of_their_domains() -> None:
    reward = CompositeReward(
        [
            ("numeric_match", 1.0, {}, ["math"]),
            ("exact_match", 2.0, {}, ["text", "chat"]),
            ("format_reward", 0.5),  # every domain, and items of none
        ],
        timeout_s=5.0,
    )
    try:
        math_result = reward("46", _in("math"))
        assert math_result.components == {"numeric_match": 1.0, "format_reward": 1.0}
        assert math_result.ok and math_result.total == 1.0 + 0.5
        # numeric_match would raise on "Paris" (not a number): it is not even called
        text_result = asyncio.run(reward.ascore("paris", _in("text", "Paris")))
        assert text_result.components == {"exact_match": 1.0, "format_reward": 0.0}
        assert text_result.ok and text_result.total == 2.0
        assert reward("46", _in(None)).components == {"format_reward": 1.0}
        assert reward("46", _in("code")).total == 0.5
        assert reward.names == ["numeric_match", "exact_match", "format_reward"]
    finally:
        reward.close()
    # an item no component applies to scores nothing, and that is no error
    only_math = CompositeReward([("numeric_match", 1.0, {}, ["math"])], timeout_s=5.0)
    result = only_math("46", _in("text"))
    only_math.close()
    assert (result.total, result.components, result.errors) == (0.0, {}, {})
    assert only_math.guard.stats()["calls"] == 0


def test_build_reward_honours_component_domains() -> None:
    cfg = RewardConfig(
        components=[
            RewardComponent(name="numeric_match", domains=["math"]),
            RewardComponent(name="exact_match", weight=3.0, domains=["text"]),
        ],
        correct_reward="numeric_match",
    )
    reward = build_reward(cfg)
    try:
        assert reward("46", _in("math")).components == {"numeric_match": 1.0}
        assert reward("Paris", _in("text", "Paris")).total == 3.0
    finally:
        reward.close()
    for bad in ([], "math", [1]):
        with pytest.raises(ValueError, match="domains must be None or a non-empty list"):
            CompositeReward([("numeric_match", 1.0, {}, bad)])

"""Group rewards: fn(completions, item) -> list[float] beside the per-answer form, composed
with weights, guarded alike, scored by the rollout worker once a group is in (single-turn
and agent episodes) and by the endpoint when a session ends; built-ins by hand."""

from __future__ import annotations

import asyncio
import doctest
import math
import threading

import pytest
from transformers import AutoTokenizer

import streamrl.rollout.rewards.group
from streamrl.config import load_config
from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import GenerationResult, Item, SamplingParams
from streamrl.models import build_char_tokenizer
from streamrl.rollout.episodes.agent import AgentEpisode
from streamrl.rollout.episodes.single_turn import SingleTurnEpisode
from streamrl.rollout.rewards import Completions, CompositeReward, RewardResult
from streamrl.rollout.rewards.group import (
    group_reward,
    length_aware,
    majority_vote,
    overlong_penalty,
)
from streamrl.rollout.tools import build_tools, get_tool_parser
from streamrl.rollout.worker import rollout_group
from streamrl.run.preflight import PreflightError, check_reward_options
from tests.paths import TESTS
from tests.tiny_run import algorithm_of

ITEM = Item(id="q", prompt="2+2=", answer="4", index=3)
RELEASE = threading.Event()


def test_doctests() -> None:
    assert doctest.testmod(streamrl.rollout.rewards.group).failed == 0


def test_majority_vote_by_hand_and_its_extractions() -> None:
    item = Item(id="q", prompt="?")  # no answer: label-free
    assert majority_vote(["7", "x 7", "8", "8", "8", ""], item) == [0, 0, 1, 1, 1, 0]
    assert majority_vote(["8", "7", "7", "8"], item) == [1, 0, 0, 1]  # tie: first given
    assert majority_vote(["none", "at all"], item) == [0.0, 0.0]  # no votes
    assert majority_vote(["7.0", "7"], item) == [1.0, 1.0]  # numbers compare as numbers
    tags = ["<answer>B</answer>", "<answer> b </answer>", "<answer>B</answer>"]
    assert majority_vote(tags, item, extract="answer_tag") == [1.0, 0.0, 1.0]
    assert majority_vote(["A b", "a  B", "a"], item, extract="text") == [1.0, 1.0, 0.0]
    boxed = ["\\boxed{x+1}", "so \\boxed{x+1}", "\\boxed{2}"]
    assert majority_vote(boxed, item, extract="boxed") == [1.0, 1.0, 0.0]
    regex = ["answer: B", "answer: C", "answer: B", "B"]
    assert majority_vote(regex, item, extract="regex:answer: (\\w)") == [1.0, 0.0, 1.0, 0.0]
    assert majority_vote(["3", "3", "4"], item, min_votes=3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="unknown extract 'digits'.*last_number"):
        majority_vote(["3"], item, extract="digits")


def test_overlong_penalty_by_hand() -> None:
    """DAPO: L_max = 100, L_cache = 40: free to 60, linear to -1 at 100, -1 beyond."""
    group = Completions(["a"] * 5, lengths=[10, 60, 70, 100, 101])
    assert overlong_penalty(group, ITEM, max_length=100, cache_length=40) == [
        0.0,
        0.0,
        -0.25,
        -1.0,
        -1.0,
    ]
    # a plain list: lengths in characters
    assert overlong_penalty(["abc", "abcdef"], ITEM, max_length=6, cache_length=2) == [0.0, -1.0]
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(group, ITEM, max_length=10, cache_length=20)


def test_length_aware_by_hand() -> None:
    """λ = 0.5 - (L - 20)/(60 - 20) for lengths 20, 30, 40, 60: 0.5, 0.25, 0, -0.5;
    the wrong answers get min(0, λ)."""
    group = Completions(["4", "5", "4", "5"], lengths=[20, 30, 40, 60])
    assert length_aware(group, ITEM) == [0.5, 0.0, 0.0, -0.5]
    # fewer than half correct: no length term (accuracy first)
    assert length_aware(Completions(["4", "5", "5"], [1, 2, 3]), ITEM) == [0.0, 0.0, 0.0]
    assert length_aware(group, ITEM, min_correct_fraction=0.0) == [0.5, 0.0, 0.0, -0.5]
    same = Completions(["4", "4"], [5, 5])
    assert length_aware(same, ITEM) == [0.0, 0.0]  # one length: nothing to prefer


def test_group_and_answer_components_compose_with_weights() -> None:
    overlong = ("overlong_penalty", 2.0, {"max_length": 4, "cache_length": 2})
    reward = CompositeReward([("numeric_match", 1.0), ("majority_vote", 0.5), overlong])
    try:
        assert reward.names == ["numeric_match", "majority_vote", "overlong_penalty"]
        assert reward.has_group and list(reward.fns) == ["numeric_match"]
        assert reward("4", ITEM) == RewardResult(1.0, {"numeric_match": 1.0})
        group = Completions(["4", "4", "5"], lengths=[2, 3, 9])
        got = reward.score_group(group, ITEM)
        assert [r.components["majority_vote"] for r in got] == [1.0, 1.0, 0.0]
        assert [r.components["overlong_penalty"] for r in got] == [0.0, -0.5, -1.0]
        assert [r.total for r in got] == [0.5, 0.5 - 1.0, -2.0]
        again = asyncio.run(reward.ascore_group(group, ITEM))
        assert again == got
        # the answer's own result plus its group's: one result
        both = reward("4", ITEM).plus(got[1])
        assert both.total == 1.0 + 0.5 - 1.0 and len(both.components) == 3
    finally:
        reward.close()


def three(completions, item) -> list[float]:
    return [1.0, 2.0, 3.0]


def raises(completions, item) -> list[float]:
    raise RuntimeError("judge is down")


def not_finite(completions, item) -> list[float]:
    return [math.nan] * len(completions)


def text(completions, item):
    return "1, 2"


def hangs(completions, item) -> list[float]:
    RELEASE.wait()
    return [0.0] * len(completions)


for _fn in (three, raises, not_finite, text, hangs):
    group_reward(_fn)


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        (three, "ValueError: group reward returned 3 values for 2 completions"),
        (raises, "RuntimeError: judge is down"),
        (not_finite, "ValueError: group reward returned nan"),
        (text, "TypeError: group reward returned str, expected a list"),
        (hangs, "timeout after 0.5s"),
    ],
)
def test_a_bad_group_reward_is_each_answers_counted_failure(fn, error: str) -> None:
    reward = CompositeReward([("numeric_match", 1.0), (fn, 1.0)], timeout_s=0.5)
    try:
        got = reward.score_group(["4", "5"], ITEM)
        assert [r.total for r in got] == [None, None]
        assert all(r.errors[fn.__name__].startswith(error) for r in got), got[0].errors
        assert reward.guard.stats()["failures"] == 1  # one call, one counted failure
        if fn is hangs:
            assert reward.guard.stats()["timeouts"] == 1
    finally:
        RELEASE.set()
        reward.close()
        RELEASE.clear()


def test_on_error_zero_keeps_the_failure_listed() -> None:
    reward = CompositeReward([(three, 1.0), ("majority_vote", 1.0)], on_error="zero")
    try:
        got = reward.score_group(["4", "4"], ITEM)
        assert [r.total for r in got] == [1.0, 1.0] and all("three" in r.errors for r in got)
    finally:
        reward.close()


@pytest.mark.slow  # (starts a forkserver and a worker process: about 18 s on 2 cores)
def test_group_reward_in_worker_processes() -> None:
    """Process isolation: the group runs in a pebble worker; a wrong count fails there."""
    reward = CompositeReward(
        [("majority_vote", 1.0), (three, 1.0)], timeout_s=60, isolation="process"
    )
    try:
        got = reward.score_group(Completions(["4", "4"], [1, 2]), ITEM)
        assert [r.components["majority_vote"] for r in got] == [1.0, 1.0]
        assert "returned 3 values for 2" in got[0].errors["three"]
    finally:
        reward.close()


class _Answers:
    """Plays the model: the answer of sample j is answers[seed order]; one char a token."""

    version = 0

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tok, self.answers, self.seeds = tokenizer, answers, {}

    async def agenerate(self, request) -> GenerationResult:
        k = self.seeds.setdefault(request.seed, len(self.seeds))
        ids = self.tok.encode(self.answers[k], add_special_tokens=False)
        n = len(ids)
        return GenerationResult(request.prompt_ids, ids, [-0.1] * n, [0] * n, "stop")


def _roll(components, answers: list[str], agent: bool = False) -> GroupDone | GroupRejected:
    reward = CompositeReward(components, timeout_s=5)
    if agent:
        tok = AutoTokenizer.from_pretrained(TESTS / "fixtures" / "qwen_style_tokenizer")
        sampling = SamplingParams(max_new_tokens=8, stop_token_ids=[tok.eos_token_id])
        tools = build_tools(["calculator"])
        episode = AgentEpisode(tok, sampling, reward, tools, get_tool_parser("hermes"))
    else:
        tok = build_char_tokenizer()
        episode = SingleTurnEpisode(tok, SamplingParams(max_new_tokens=8), reward)
    algorithm = algorithm_of(load_config(None, ["algorithm.dynamic_sampling=false"]))
    engine = _Answers(tok, answers)
    try:
        return asyncio.run(
            rollout_group(engine, episode, algorithm, ITEM, len(answers), 0, reward=reward)
        )
    finally:
        reward.close()


def test_the_worker_scores_the_group_once_its_samples_are_in() -> None:
    """Rewards = numeric_match + 0.5 majority_vote + length_aware over the answers'
    generated tokens (lengths 1, 3, 1, 1: 4, 4+4, 5, 4 all right but one)."""
    components = [("numeric_match", 1.0), ("majority_vote", 0.5), ("length_aware", 1.0)]
    report = _roll(components, ["4", "4+0", "5", "4"])
    assert isinstance(report, GroupDone)
    by_answer = {t.metadata["completion"]: t for t in report.trajectories}
    # λ over lengths 1..3: 0.5 for length 1, -0.5 for length 3; "5" is wrong: min(0, 0.5)
    assert by_answer["4"].reward == 1.0 + 0.5 + 0.5
    assert by_answer["4+0"].reward == 0.0 + 0.0 - 0.5  # numeric_match reads the last number
    assert by_answer["5"].reward == 0.0 + 0.0 + 0.0
    comps = by_answer["4"].metadata["reward_components"]
    assert comps == {"numeric_match": 1.0, "majority_vote": 1.0, "length_aware": 0.5}


def test_agent_episodes_are_scored_as_a_group_by_their_final_answers() -> None:
    report = _roll([("numeric_match", 0.0), ("majority_vote", 1.0)], ["5", "4", "5"], agent=True)
    assert isinstance(report, GroupDone)
    got = sorted((t.metadata["completion"], t.reward) for t in report.trajectories)
    assert got == [("4", 0.0), ("5", 1.0), ("5", 1.0)]
    assert all("agent/turns" in t.metadata["metrics"] for t in report.trajectories)


def test_a_failed_group_reward_fails_the_group_counted() -> None:
    report = _roll([("numeric_match", 1.0), (three, 1.0)], ["4", "5"])
    assert isinstance(report, GroupRejected)
    assert (report.outcome, report.reason) == ("failed", "reward_error:three")
    assert "3 values for 2 completions" in report.detail


def test_preflight_refuses_a_group_reward_as_the_held_out_judge(tmp_path) -> None:
    cfg = load_config(
        None,
        ["reward.components=[{name: majority_vote}]", "reward.correct_reward=majority_vote"],
    )
    with pytest.raises(PreflightError, match="correct_reward='majority_vote' scores whole"):
        check_reward_options(cfg)
    bad = load_config(None, ["reward.components=[{name: nope}]"])
    with pytest.raises(PreflightError, match="known: .*length_aware.*majority_vote"):
        check_reward_options(bad)


def test_an_endpoint_session_is_scored_as_a_group_when_it_ends(tmp_path) -> None:
    """The client reports 0.25 for each of its 3 completions ("4", "4", "4"); the run's
    majority_vote (weight 2) adds 2 to each: the group's rewards are 2.25."""
    import httpx

    from streamrl.stream.sample_stream import SampleStream
    from tests.endpoint_harness import endpoint_cfg, served

    components = "[{name: numeric_match}, {name: majority_vote, weight: 2.0}]"
    cfg = endpoint_cfg(tmp_path, f"reward.components={components}")
    with served(cfg, tmp_path, stream=SampleStream(1, 0)) as pool:
        auth = {"Authorization": f"Bearer {pool.token}"}
        messages = [{"role": "user", "content": "2+2="}]
        body = {"model": "x", "messages": messages, "n": 3, "max_tokens": 3, "session_id": "s"}
        url = pool.base_url
        assert httpx.post(f"{url}/chat/completions", json=body, headers=auth).status_code == 200
        r = httpx.post(f"{url}/sessions/s/reward", json={"reward": 0.25}, headers=auth)
        assert r.status_code == 200
        batch = pool.stream.get_batch(timeout=30)
    (group,) = batch
    assert [t.reward for t in group.trajectories] == [2.25] * 3
    assert group.trajectories[0].metadata["reward_components"]["majority_vote"] == 1.0

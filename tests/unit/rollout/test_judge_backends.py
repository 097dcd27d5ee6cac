"""Judges behind one backend interface (url | engine | policy) and ``rubric_judge``:
rubric scores by hand with a fake backend, the unparseable reply and the missing or
malformed rubric as counted failures (a data file's bad rubric names file:line:field),
per-criterion details in the sample and the step metrics, the policy backend bound to a
worker's engine (one batch per group), and a frozen tiny model as the engine backend."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence

import pytest
import torch

import streamrl.rollout.rewards.rubric as rubric_module
from streamrl.core.types import GenerationResult, Item, Trajectory
from streamrl.models import build_char_tokenizer
from streamrl.rollout.rewards import CompositeReward, reward_names
from streamrl.rollout.rewards.group import Scores, check_values
from streamrl.rollout.rewards.judges import JudgeSpec
from streamrl.rollout.rewards.rubric import rubric_judge
from streamrl.rollout.rewards.scoring import add_group_rewards
from streamrl.run.step_metrics import component_metrics
from streamrl.sources import DataError
from streamrl.sources.files import JsonlTaskSource

RUBRIC = [
    {"criterion": "The answer is 4", "weight": 3, "name": "right"},
    {"criterion": "The answer is short", "weight": 1, "name": "short"},
]
ITEM = Item(id="q", prompt="2+2=", metadata={"rubric": RUBRIC})
ANSWERS = ["4", "it is 4", "5"]


class FakeBackend:
    """Replies by ``rule(prompt)``; records each batch it was asked."""

    def __init__(self, rule: Callable[[str], str]) -> None:
        self.rule, self.batches = rule, []

    def ask(self, prompts: Sequence[str]) -> list[str]:
        self.batches.append(list(prompts))
        return [self.rule(p) for p in prompts]


def marks(prompt: str) -> str:
    """10 for "4" on the rightness criterion; 10 under 3 characters, else 5, on shortness;
    "hmm" (no number) for the answer "5" on shortness."""
    answer = prompt.split("Response: ")[1].split("\nCriterion")[0]
    if "is 4" in prompt.split("Criterion: ")[1]:
        return "10" if "4" in answer else "0/10"
    return "hmm" if answer == "5" else ("10" if len(answer) < 3 else "5")


@pytest.fixture
def fake(monkeypatch) -> FakeBackend:
    backend = FakeBackend(marks)
    monkeypatch.setattr(rubric_module, "judge_backend", lambda spec: backend)
    return backend


SPEC = JudgeSpec(backend="url", url="http://127.0.0.1:9/v1")


def test_rubric_scores_by_hand(fake) -> None:
    """right (w 3) 1, 1, 0; short (w 1) 1, 0.5, unparsed: skipped, weights renormalised."""
    got = rubric_judge(ANSWERS, ITEM, SPEC, unparsed="skip")
    assert got == [1.0, (3 * 1 + 0.5) / 4, 0.0]
    assert got.details == [
        {"right": 1.0, "short": 1.0, "_unparsed": 0.0},
        {"right": 1.0, "short": 0.5, "_unparsed": 0.0},
        {"right": 0.0, "_unparsed": 1.0},
    ]
    assert len(fake.batches) == 1 and len(fake.batches[0]) == 6  # one batch: 3 x 2


def test_an_unparseable_reply_is_a_counted_failure(fake) -> None:
    reward = CompositeReward([("rubric_judge", 1.0, {"judge": SPEC})], timeout_s=30)
    try:
        failed = reward.score_group(ANSWERS, ITEM)
        ok = reward.score_group(ANSWERS[:2], ITEM)
    finally:
        reward.close()
    assert [r.total for r in failed] == [None] * 3
    assert "criterion 'short': llm_judge: no number" in failed[0].errors["rubric_judge"]
    assert reward.guard.stats()["failures"] == 1
    assert [r.total for r in ok] == [1.0, 0.875]
    assert ok[1].details == {"rubric_judge": {"right": 1.0, "short": 0.5}}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({}, "item 'q' has no rubric"),
        ({"rubric": []}, "field 'rubric': expected a non-empty list"),
        ({"rubric": [{"criterion": "x", "weight": -1}]}, "field 'rubric[0].weight'"),
        ({"rubric": [{"weight": 1}]}, "field 'rubric[0].criterion'"),
    ],
)
def test_a_missing_or_bad_rubric_is_a_counted_failure(fake, metadata, message) -> None:
    reward = CompositeReward([("rubric_judge", 1.0, {"judge": SPEC})], timeout_s=30)
    try:
        got = reward.score_group(ANSWERS, Item(id="q", prompt="2+2=", metadata=metadata))
    finally:
        reward.close()
    assert all(message in r.errors["rubric_judge"] for r in got)
    assert reward.guard.stats()["failures"] == 1 and not fake.batches


@pytest.mark.parametrize(
    ("rubric", "field", "message"),
    [
        ("be good", "rubric", "expected a non-empty list"),
        ([{"criterion": "x"}, {"criterion": "y", "weight": 0}], "rubric[1].weight", "positive"),
        ([{"criterion": "x", "weight": "2"}], "rubric[0].weight", "positive"),
        ([{"criterion": "x", "weight": True}], "rubric[0].weight", "positive"),
        ([{"criterion": ""}], "rubric[0].criterion", "non-empty string"),
        ([{"criterion": "x", "points": 2}], "rubric[0].points", "unknown key"),
        (
            [{"criterion": "x", "name": "a"}, {"criterion": "y", "name": "a"}],
            "rubric[1].name",
            "duplicate",
        ),
        ([{"criterion": "x", "name": "a/b"}], "rubric[0].name", "letter or digit"),
        (["x"], "rubric[0]", "expected an object"),
    ],
)
def test_a_bad_rubric_in_a_data_file_names_file_line_and_field(tmp_path, rubric, field, message):
    path = tmp_path / "judged.jsonl"
    good = {"prompt": "1+1=", "answer": 2, "rubric": [{"criterion": "says 2"}]}
    rows = [good, {"prompt": "2+2=", "answer": 4, "rubric": rubric}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DataError) as err:
        JsonlTaskSource(path, heldout_fraction=0)
    assert str(err.value).startswith(f"{path}:2: field '{field}': ")
    assert message in str(err.value)


def test_a_good_rubric_in_a_data_file_is_normalised(tmp_path) -> None:
    path = tmp_path / "judged.jsonl"
    row = {"prompt": "1+1=", "metadata": {"rubric": [{"criterion": "says 2", "weight": 2}]}}
    path.write_text(json.dumps(row) + "\n")
    (item,) = JsonlTaskSource(path, heldout_fraction=1).heldout()
    assert item.metadata["rubric"] == [{"name": "c1", "criterion": "says 2", "weight": 2.0}]


def sample(completion: str) -> Trajectory:
    ids = torch.tensor([1, 2])
    mask = torch.tensor([False, True])
    return Trajectory(
        ids,
        mask,
        torch.zeros(2),
        torch.zeros(2, dtype=torch.long),
        0.0,
        0,
        {"completion": completion, "reward_components": {}},
    )


def test_details_reach_the_sample_and_the_step_metrics(fake) -> None:
    import asyncio

    reward = CompositeReward([("rubric_judge", 1.0, {"judge": SPEC})], timeout_s=30)
    trajectories = [sample(a) for a in ANSWERS[:2]]
    try:
        asyncio.run(add_group_rewards(reward, ITEM, trajectories))
    finally:
        reward.close()
    assert trajectories[1].metadata["reward_details"] == {
        "rubric_judge": {"right": 1.0, "short": 0.5}
    }
    m = component_metrics(trajectories, "numeric_match")
    assert m["reward/rubric_judge"] == pytest.approx((1.0 + 0.875) / 2)
    assert m["reward/rubric_judge/short"] == pytest.approx(0.75)
    assert m["reward/rubric_judge/right"] == 1.0


def test_scores_keep_their_details_across_processes_and_checks() -> None:
    scores = Scores([1, 0.5], [{"a": 1}, {"a": 0.5}])
    again = pickle.loads(pickle.dumps(check_values(scores, 2)))
    assert isinstance(again, Scores) and again.details == [{"a": 1.0}, {"a": 0.5}]
    with pytest.raises(ValueError, match="detail 'a' is nan"):
        check_values(Scores([1.0], [{"a": float("nan")}]), 1)


class ScriptedEngine:
    """An engine whose every reply is ``reply``; counts ``generate`` calls."""

    def __init__(self, tokenizer, reply: str) -> None:
        self.tokenizer, self.reply, self.calls = tokenizer, reply, []

    def generate(self, requests):
        self.calls.append(len(requests))
        ids = self.tokenizer.encode(self.reply)
        return [
            GenerationResult(r.prompt_ids, ids, [0.0] * len(ids), [0] * len(ids), "stop")
            for r in requests
        ]


def test_the_policy_backend_asks_the_bound_engine_one_batch_per_group() -> None:
    """A judge that always says A: with the swap every answer gets 0.5; 6 pairs x 2
    orders in one generate call. Unbound, it is a counted failure."""
    options = {"judge": {"backend": "policy", "max_new_tokens": 2}}
    reward = CompositeReward([("pairwise_judge", 1.0, options)], timeout_s=30)
    engine = ScriptedEngine(build_char_tokenizer(), "A")
    try:
        unbound = reward.score_group(["a", "b", "c", "d"], ITEM)
        reward.bind_policy(engine, engine.tokenizer)
        bound = reward.score_group(["a", "b", "c", "d"], ITEM)
    finally:
        reward.close()
    assert "not bound to a rollout worker's engine" in unbound[0].errors["pairwise_judge"]
    assert [r.total for r in bound] == [0.5] * 4 and engine.calls == [12]


def test_the_policy_backend_needs_thread_isolation() -> None:
    with pytest.raises(ValueError, match="needs reward.isolation: thread"):
        CompositeReward(
            [("tournament_judge", 1.0, {"judge": {"backend": "policy"}})], isolation="process"
        )


def test_bad_judge_options_fail_the_build() -> None:
    with pytest.raises(ValueError, match="judge.model: the frozen judge"):
        CompositeReward([("rubric_judge", 1.0, {"judge": {"backend": "engine"}})])
    with pytest.raises(ValueError, match="judge.backend"):
        CompositeReward([("rubric_judge", 1.0, {"judge": {"backend": "oracle"}})])
    with pytest.raises(ValueError, match="unknown placeholder"):
        CompositeReward([("rubric_judge", 1.0, {"judge": SPEC, "template": "{question}"})])
    assert {"pairwise_judge", "tournament_judge", "rubric_judge"} <= set(reward_names())
    known = r"unknown reward 'nope'; known: .*\bpairwise_judge\b.*\brubric_judge\b.*\btournament_judge\b"
    with pytest.raises(ValueError, match=known):
        CompositeReward([("nope", 1.0)])


def test_a_frozen_tiny_model_as_the_engine_backend() -> None:
    """The tiny preset judges (random text: a score in [0, 1] per criterion, or a counted
    parse failure); greedy, so the same twice."""
    options = {
        "judge": {"backend": "engine", "model": "tiny-small", "max_new_tokens": 4},
        "unparsed": "skip",
    }
    reward = CompositeReward([("rubric_judge", 1.0, options)], timeout_s=120)
    try:
        first, again = (reward.score_group(ANSWERS, ITEM) for _ in range(2))
    finally:
        reward.close()
    for r in first:
        if r.ok:
            assert 0.0 <= r.total <= 1.0 and set(r.details["rubric_judge"]) >= {"_unparsed"}
        else:
            assert "no criterion of answer" in r.errors["rubric_judge"]
    assert [(r.total, r.details) for r in first] == [(r.total, r.details) for r in again]


def test_doctests() -> None:
    import doctest

    import streamrl.rollout.rewards.judges
    import streamrl.rollout.rewards.rubric
    import streamrl.sources.rubrics

    for module in (
        streamrl.rollout.rewards.judges,
        streamrl.rollout.rewards.rubric,
        streamrl.sources.rubrics,
    ):
        assert doctest.testmod(module).failed == 0


def test_a_rollout_worker_binds_its_engine_to_a_policy_judge(tiny_config) -> None:
    from streamrl.run.assembly import rollout_spec
    from streamrl.stream.backends import make_worker

    components = [
        {"name": "rubric_judge", "options": {"judge": {"backend": "policy"}}},
        {"name": "numeric_match", "weight": 0.0},
    ]
    cfg = tiny_config(f"reward.components={json.dumps(components)}")
    engine = ScriptedEngine(build_char_tokenizer(), "8")
    worker = make_worker(rollout_spec(cfg), engine, engine.tokenizer, lambda report: None)
    try:
        got = worker.reward.score_group(ANSWERS, ITEM)
    finally:
        worker.reward.close()
    assert [r.total for r in got] == [pytest.approx(0.8)] * 3 and engine.calls == [6]


def test_preflight_refuses_rubric_judge_on_items_without_rubrics(tiny_config) -> None:
    from streamrl.run.preflight import PreflightError, preflight

    components = [
        {"name": "rubric_judge", "options": {"judge": {"backend": "policy"}}},
        {"name": "numeric_match", "weight": 0.0},
    ]
    cfg = tiny_config(f"reward.components={json.dumps(components)}")  # (arithmetic items)
    with pytest.raises(PreflightError, match="rubric_judge scores items by their rubric, but"):
        preflight(cfg, output_dir=False)

"""Model-based rewards: a batched reward model and an LLM judge, under the reward guard."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

import streamrl.rollout.rewards.llm_judge as judge_module
from streamrl.core.types import GenerationResult, Item
from streamrl.models import build_char_tokenizer
from streamrl.rollout.rewards import (
    CompositeReward,
    get_reward,
    load_judge,
    load_reward_model,
    parse_judgement,
)
from streamrl.rollout.rewards.llm_judge import Judge, llm_judge
from streamrl.rollout.rewards.reward_model import MicroBatcher, reward_model

ITEM = Item(id="q", prompt="12+34=", answer="46")
CHAT = Item(id="c", messages=[{"role": "user", "content": "12+34="}], answer="46")
COMPLETIONS = ["46", "45", "forty-six, I think", "4"]
WAIT_MS = 60_000.0  # "wait for a full batch": a batch forms by count, never by the clock


def save_reward_model(path: Path, *, num_labels: int = 1, padding_side: str = "left") -> str:
    """A tiny random Llama sequence classifier and the char tokenizer, saved to ``path``."""
    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = padding_side
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,  # scores far enough apart to tell texts apart
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_reward_model(tmp_path_factory.mktemp("rm"))


def direct_logits(path: str, text: str, add_special_tokens: bool = True) -> list[float]:
    """The model's logits for ``text`` alone (no padding), outside the reward's code path."""
    loaded = load_reward_model(path)
    ids = loaded.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    with torch.inference_mode():
        return loaded.model(input_ids=torch.tensor([ids])).logits[0].tolist()


def concurrently(fn, args_list: list[tuple]) -> list:
    """``fn(*args)`` for every args tuple, each on its own thread, started together."""
    results: list = [None] * len(args_list)
    start = threading.Barrier(len(args_list))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = fn(*args_list[i])
        except Exception as e:  # noqa: BLE001 - returned for the test to inspect
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args_list))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# ----------------------------------------------------------------------------- reward_model


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_scores_equal_one_at_a_time_scores(tmp_path: Path, padding_side: str) -> None:
    path = save_reward_model(tmp_path, padding_side=padding_side)
    calls = [(c, ITEM) for c in COMPLETIONS] + [("46", CHAT)]  # lengths 7..24 tokens
    alone = [reward_model(c, item, path=path, batch_size=1) for c, item in calls]
    loaded = load_reward_model(path)
    before = loaded.forwards
    batched = concurrently(
        lambda c, item: reward_model(c, item, path=path, batch_size=5, max_wait_ms=WAIT_MS), calls
    )
    assert loaded.forwards - before == 1  # all five texts in one padded forward
    assert batched == pytest.approx(alone, abs=1e-5)
    # and both are the model's own logit for the unpadded text (chat: its chat template)
    assert alone[0] == pytest.approx(direct_logits(path, "12+34=46")[0], abs=1e-6)
    rendered = "<bos>user: 12+34=\nassistant: 46"
    assert alone[4] == pytest.approx(direct_logits(path, rendered, False)[0], abs=1e-6)
    assert len({round(s, 4) for s in alone}) == 5  # (the texts really score differently)


def test_concurrent_calls_share_forwards_under_the_guard(rm_path: str) -> None:
    # The rollout worker scores a group at once; the guard runs 4 calls at a time.
    options = {"path": rm_path, "batch_size": 4, "max_wait_ms": WAIT_MS}
    reward = CompositeReward([("reward_model", 1.0, options)], timeout_s=120.0)
    loaded = load_reward_model(rm_path)
    before = loaded.forwards

    async def group() -> list:
        return await asyncio.gather(*(reward.ascore(c, ITEM) for c in COMPLETIONS * 2))

    try:
        results = asyncio.run(group())
    finally:
        reward.close()
    assert loaded.forwards - before == 2  # 8 completions, batches of 4
    alone = [reward_model(c, ITEM, path=rm_path, batch_size=1) for c in COMPLETIONS * 2]
    assert [r.total for r in results] == pytest.approx(alone, abs=1e-5)
    assert all(r.ok for r in results)


def test_micro_batcher_gathers_by_count_and_by_time() -> None:
    seen: list[list[int]] = []

    def double(xs: list[int]) -> list[int]:
        seen.append(list(xs))
        return [2 * x for x in xs]

    full = MicroBatcher(double, batch_size=3, max_wait_s=WAIT_MS)
    assert sorted(concurrently(full.submit, [(1,), (2,), (3,), (4,), (5,), (6,)])) == [
        2,
        4,
        6,
        8,
        10,
        12,
    ]
    assert full.batches == 2 and sorted(len(b) for b in seen) == [3, 3]
    alone = MicroBatcher(double, batch_size=8, max_wait_s=0.0)  # never waits: one call, one batch
    assert [alone.submit(7), alone.submit(8)] == [14, 16] and alone.batches == 2

    def boom(xs: list[int]) -> list[int]:
        raise RuntimeError(f"bad batch {xs}")

    failing = MicroBatcher(boom, batch_size=2, max_wait_s=WAIT_MS)
    errors = concurrently(failing.submit, [(1,), (2,)])
    assert all(isinstance(e, RuntimeError) for e in errors)  # every caller gets the failure


def test_label_sigmoid_and_template(tmp_path: Path) -> None:
    path = save_reward_model(tmp_path, num_labels=3)
    logits = direct_logits(path, "12+34=46")
    for label in range(3):
        assert reward_model("46", ITEM, path=path, label=label) == pytest.approx(logits[label])
    prob = reward_model("46", ITEM, path=path, label=2, sigmoid=True)
    assert prob == pytest.approx(1.0 / (1.0 + math.exp(-logits[2])))
    with pytest.raises(ValueError, match=r"label 3 is not in \[0, 3\)"):
        reward_model("46", ITEM, path=path, label=3)
    # a template decides the text: its score is the model's score of that text
    templated = reward_model("46", CHAT, path=path, template="Q: {prompt} A: {completion}")
    assert templated == pytest.approx(direct_logits(path, "Q: user: 12+34= A: 46")[0])
    with pytest.raises(ValueError, match="no reference answer"):
        reward_model("46", Item(id="x", prompt="?"), path=path, template="{answer}")


def test_missing_path_is_a_clear_error(tmp_path: Path, rm_path: str) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="reward_model: no model directory at '.*nope'"):
        reward_model("46", ITEM, path=missing)
    for isolation in ("thread", "process"):  # the build fails, naming the component
        with pytest.raises(ValueError, match="'reward_model': reward_model: no model directory"):
            CompositeReward([("reward_model", 1.0, {"path": missing})], isolation=isolation)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        reward_model("46", ITEM, path=str(tmp_path))
    with pytest.raises(ValueError, match=r"unknown placeholder \{question\}"):
        CompositeReward([("reward_model", 1.0, {"path": rm_path, "template": "{question}"})])


def test_the_model_is_loaded_once_per_process(rm_path: str) -> None:
    assert load_reward_model(rm_path) is load_reward_model(rm_path + "/")
    # get_reward binds the options into a partial that pickles (process isolation)
    reward = CompositeReward([("reward_model", 1.0, {"path": rm_path})], isolation="process")
    reward.close()


@pytest.mark.slow
def test_reward_model_in_a_worker_process(rm_path: str) -> None:
    reward = CompositeReward(
        [("reward_model", 1.0, {"path": rm_path}), ("numeric_match", 1.0)],
        timeout_s=120.0,
        isolation="process",
    )
    try:
        result = reward("46", ITEM)
    finally:
        reward.close()
    assert result.ok, result.errors
    expected = reward_model("46", ITEM, path=rm_path) + 1.0
    assert result.total == pytest.approx(expected, abs=1e-5)


# ----------------------------------------------------------------------------- llm_judge


def test_parse_judgement() -> None:
    assert parse_judgement("7") == pytest.approx(0.7)
    assert parse_judgement("Score: 7/10") == pytest.approx(0.7)  # the first number
    assert parse_judgement("15") == 1.0 and parse_judgement("-2 points") == 0.0  # clipped
    assert parse_judgement("3", "number", 1, 5) == 0.5
    assert parse_judgement("4.5 out of 5", "number", 1, 5) == pytest.approx(0.875)
    assert parse_judgement(" YES.", "yes_no") == 1.0
    assert parse_judgement("no, yes would be wrong", "yes_no") == 0.0
    for text, parse in [("seven", "number"), ("Not sure", "yes_no"), ("none", "yes_no")]:
        with pytest.raises(ValueError, match="in the judge's output"):
            parse_judgement(text, parse)
    with pytest.raises(ValueError, match="parse must be one of number, yes_no"):
        parse_judgement("1", "score")
    with pytest.raises(ValueError, match="need max > min"):
        parse_judgement("1", "number", 5, 5)


class FakeEngine:
    """Answers every request with the next scripted text; records the requests."""

    max_seq_len = 256

    def __init__(self, tokenizer, outputs: list[str]) -> None:
        self.tokenizer, self.outputs, self.requests = tokenizer, list(outputs), []

    def generate(self, requests):
        self.requests.extend(requests)
        ids = [self.tokenizer.encode(self.outputs.pop(0)) for _ in requests]
        return [
            GenerationResult(r.prompt_ids, t, [0.0] * len(t), [0] * len(t), "stop")
            for r, t in zip(requests, ids, strict=True)
        ]


def test_judge_prompt_and_parsing_with_injected_outputs(monkeypatch) -> None:
    tokenizer = build_char_tokenizer()
    engine = FakeEngine(tokenizer, ["Yes, it is.", "maybe", "8"])
    monkeypatch.setattr(judge_module, "load_judge", lambda *a, **k: Judge(engine, tokenizer))
    options = {"model": "fake", "template": "Is {completion} right for {prompt} ({answer})?"}
    yes_no = CompositeReward([("llm_judge", 1.0, {**options, "parse": "yes_no"})])
    try:
        assert yes_no("46", ITEM).components == {"llm_judge": 1.0}
        (request,) = engine.requests
        prompt = tokenizer.decode(request.prompt_ids)  # (the chat template's format)
        assert prompt == "<bos>user: Is 46 right for 12+34= (46)?\nassistant: "
        assert request.params.temperature == 0.0 and request.params.max_new_tokens == 16
        assert request.params.stop_token_ids == [tokenizer.eos_token_id]
        failed = yes_no("45", ITEM)  # unparseable: a recorded failure, counted
        assert failed.total is None
        assert failed.errors["llm_judge"].startswith("ValueError: llm_judge: no yes or no in")
        assert yes_no.guard.stats()["failures"] == 1
    finally:
        yes_no.close()
    number = get_reward("llm_judge", **options, min=0, max=10, chat=False)
    assert number("46", ITEM) == pytest.approx(0.8)
    assert tokenizer.decode(engine.requests[-1].prompt_ids) == "<bos>Is 46 right for 12+34= (46)?"


def test_judge_end_to_end_with_a_tiny_model() -> None:
    options = {"model": "tiny-small", "template": "{prompt}{completion}=", "max_new_tokens": 6}
    reward = CompositeReward([("llm_judge", 1.0, options)], timeout_s=120.0)
    try:
        first, again = reward("46", ITEM), reward("46", ITEM)
    finally:
        reward.close()
    # a random judge writes random text: a score in [0, 1], or a recorded parse failure
    if first.ok:
        assert 0.0 <= first.components["llm_judge"] <= 1.0
    else:
        assert first.errors["llm_judge"].startswith("ValueError: llm_judge: no number")
    assert (first.components, first.errors) == (again.components, again.errors)  # greedy


def test_concurrent_judge_calls_share_forwards() -> None:
    judge = load_judge("tiny-small", seed=3)
    engine = judge.engine
    stats = engine.stats
    engine.pause()  # hold the steps until all four requests are queued
    results: list = []
    calls = [(c, ITEM) for c in COMPLETIONS]

    def judge_all() -> None:
        options = {
            "model": "tiny-small",
            "seed": 3,
            "max_new_tokens": 5,
            "template": "{completion}",
        }
        results.extend(concurrently(lambda c, item: llm_judge(c, item, **options), calls))

    runner = threading.Thread(target=judge_all)
    runner.start()
    deadline = time.monotonic() + 60  # (only so that a bug fails rather than hangs)
    while engine.num_pending < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    before = (stats.prefill_steps, stats.decode_steps, stats.requests_finished)
    engine.resume()
    runner.join()
    assert engine.num_pending == 0
    prefills, decodes, finished = (
        stats.prefill_steps - before[0],
        stats.decode_steps - before[1],
        stats.requests_finished - before[2],
    )
    assert finished == 4 and prefills == 1  # all four prompts in one forward
    assert decodes <= 4  # then one forward per token for all of them (alone: up to 4 x 4)
    assert all(isinstance(r, float | ValueError) for r in results)

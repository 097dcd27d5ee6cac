"""Evaluation runs the training episode: per-item budgets, greedy decoding, failures."""

from __future__ import annotations

from streamrl.analysis.evaluate import evaluate_model
from streamrl.config import load_config
from streamrl.core.types import Item
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.rewards import build_reward
from streamrl.run.assembly import episode_spec


def _items() -> list[Item]:
    return [
        Item(id="a", prompt="1+1=", answer="2"),
        Item(id="b", prompt="1+2=", answer="3", metadata={"max_new_tokens": 7}),
    ]


def test_evaluation_honours_per_item_budgets_as_training_does() -> None:
    """Regression: evaluation used to re-implement the episode and ignored an item's
    metadata.max_new_tokens, so long-tail items were evaluated under another budget."""
    cfg = load_config(None, ["rollout.max_new_tokens=2", "rollout.ignore_eos=true"])
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    reward = build_reward(cfg.reward)
    train_episode = build_episode(episode_spec(cfg), tokenizer, reward)
    res = evaluate_model(model, tokenizer, train_episode, _items(), "numeric_match")
    assert [it["generated_tokens"] for it in res.items] == [[2], [7]]
    # eval.max_new_tokens replaces the default budget, never an item's own
    eval_episode = build_episode(episode_spec(cfg), tokenizer, reward, max_new_tokens=4)
    res = evaluate_model(model, tokenizer, eval_episode, _items(), "numeric_match")
    assert [it["generated_tokens"] for it in res.items] == [[4], [7]]
    assert res.metrics["n_items"] == 2 and res.episode_failures == 0


def test_greedy_evaluation_is_deterministic_and_sampling_uses_n() -> None:
    cfg = load_config(None, ["rollout.max_new_tokens=3"])
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=1)
    episode = build_episode(episode_spec(cfg), tokenizer, build_reward(cfg.reward))
    first = evaluate_model(model, tokenizer, episode, _items(), "numeric_match")
    again = evaluate_model(model, tokenizer, episode, _items(), "numeric_match")
    assert [it["completions"] for it in first.items] == [it["completions"] for it in again.items]
    sampled = evaluate_model(
        model, tokenizer, episode, _items(), "numeric_match", greedy=False, samples_per_item=3
    )
    assert all(len(it["completions"]) == 3 for it in sampled.items)
    assert sampled.metrics["n_samples"] == 3 and "pass@1" in sampled.metrics


def test_an_episode_that_raises_is_an_incorrect_recorded_sample() -> None:
    cfg = load_config(None, [])
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    episode = build_episode(episode_spec(cfg), tokenizer, build_reward(cfg.reward))
    bad = Item(id="bad", prompt=None, messages=None, answer="1")  # neither prompt nor messages
    res = evaluate_model(model, tokenizer, episode, [bad, *_items()], "numeric_match")
    assert res.episode_failures == 1 and res.items[0]["correct"] == [False]
    assert "exactly one of" in res.items[0]["reward_errors"][0]["episode"]

"""The mixture task source (domains), and evaluation per domain."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

from streamrl.analysis.evaluate import evaluate
from streamrl.core.types import Item, Trajectory
from streamrl.sources import (
    ArithmeticTaskSource,
    MixtureTaskSource,
    build_task_source,
    item_correct_reward,
    item_domain,
)

ADD = {"digits": 2, "operators": "+"}
MUL = {"digits": 2, "operators": "*"}


def mixture(add_weight: float = 3.0, mul_weight: float = 1.0) -> MixtureTaskSource:
    return build_task_source(
        "mixture",
        sources=[
            {"name": "add", "kind": "arithmetic", "options": ADD, "weight": add_weight},
            {
                "name": "mul",
                "kind": "arithmetic",
                "options": MUL,
                "weight": mul_weight,
                "correct_reward": "exact_match",
            },
        ],
    )


def test_items_are_tagged_with_their_domain_and_prefixed_ids() -> None:
    items = list(itertools.islice(mixture().train_iter(seed=0), 50))
    assert {item_domain(it) for it in items} == {"add", "mul"}
    for it in items:
        name = item_domain(it)
        assert it.id.startswith(f"{name}/arith:")
        assert ("+" in it.prompt) == (name == "add")
        # only the source that names a correct reward sets it
        assert item_correct_reward(it, "numeric_match") == (
            "exact_match" if name == "mul" else "numeric_match"
        )
        assert ("correct_reward" in it.metadata) == (name == "mul")
    assert item_domain(Item(id="x", prompt="?")) is None


def test_train_iter_is_each_sources_own_stream_drawn_by_weight() -> None:
    seed = 11
    items = list(itertools.islice(mixture().train_iter(seed), 4000))
    again = list(itertools.islice(mixture().train_iter(seed), 4000))
    other = list(itertools.islice(mixture().train_iter(seed + 1), 4000))
    assert [it.id for it in items] == [it.id for it in again]  # deterministic for a seed
    assert [it.id for it in items] != [it.id for it in other]
    # source k's items, in order, are its own train_iter(seed + k)
    for k, (name, options) in enumerate([("add", ADD), ("mul", MUL)]):
        mine = [it.id for it in items if item_domain(it) == name]
        own = ArithmeticTaskSource(**options).train_iter(seed + k)
        assert mine == [f"{name}/{it.id}" for it in itertools.islice(own, len(mine))]
    counts = collections.Counter(item_domain(it) for it in items)
    assert counts["add"] == 3018  # weight 3 of 4: 0.7545 of the draws with this seed


def test_heldout_shares_follow_the_weights_in_a_fixed_order() -> None:
    src = mixture(3, 1)
    assert src.shares(10) == [8, 2]  # 7.5 and 2.5: the tie goes to the first source
    assert src.shares(4) == [3, 1] and src.shares(1) == [1, 1]  # at least one each
    held = src.heldout(10)
    assert [item_domain(it) for it in held] == ["add"] * 8 + ["mul"] * 2
    assert [it.id for it in held[:8]] == [
        f"add/{it.id}" for it in ArithmeticTaskSource(**ADD).heldout(8)
    ]
    assert [it.id for it in held] == [it.id for it in src.heldout(10)]  # fixed
    assert len({it.id for it in src.heldout(None)}) == len(src.heldout(None))  # unique ids
    assert len(src.heldout(None)) == sum(
        len(ArithmeticTaskSource(**o).heldout(None)) for o in (ADD, MUL)
    )
    assert src.heldout(0) == []
    assert mixture(1, 2).shares(7) == [2, 5]  # 2.33 and 4.67


@pytest.mark.parametrize(
    "sources, message",
    [
        ([], r"data.options.sources: expected a non-empty list"),
        (
            [{"name": "a", "kind": "arithmetic"}, "b"],
            r"data.options.sources\[1\]: Input should be a valid dictionary",
        ),
        (
            [{"name": "a", "kind": "arithmetic"}, {"name": "b", "kind": "nope"}],
            r"data.options.sources\[1\].kind: unknown kind 'nope'; known: arithmetic",
        ),
        (
            [{"name": "a", "kind": "arithmetic"}, {"name": "a", "kind": "arithmetic"}],
            r"data.options.sources\[1\].name: duplicate source name 'a'",
        ),
        ([{"kind": "arithmetic"}], r"data.options.sources\[0\].name: expected a non-empty name"),
        (
            [{"name": "a", "kind": "arithmetic", "weight": 0}],
            r"data.options.sources\[0\].weight: expected a number > 0, got 0",
        ),
        (
            [{"name": "a", "kind": "arithmetic", "wieght": 2}],
            r"data.options.sources\[0\].wieght: unknown key; known: name, kind",
        ),
        (
            [
                {"name": "a", "kind": "arithmetic"},
                {"name": "b", "kind": "arithmetic", "options": {"digit": 1}},
            ],
            r"data.options.sources\[1\].options.digit: unknown option; accepted: digits",
        ),
        (
            [{"name": "a", "kind": "arithmetic", "options": {"digits": 0}}],
            r"data.options.sources\[0\].options: arithmetic: digits must be >= 1, got 0",
        ),
        (
            [{"name": "a", "kind": "arithmetic", "correct_reward": 3}],
            r"data.options.sources\[0\].correct_reward: expected a reward name, got 3",
        ),
    ],
)
def test_bad_options_name_the_source_and_key(sources: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):  # a DataError, or an OptionsError
        build_task_source("mixture", sources=sources)


# ----------------------------------------------------------------------------- evaluation


def scripted_episode(components: dict[str, dict[str, float]]):
    """An episode whose reward components are scripted per item id (no engine)."""

    async def episode(engine, item, seed, *, greedy=False) -> Trajectory:
        n = 3
        return Trajectory(
            input_ids=torch.zeros(n, dtype=torch.long),
            loss_mask=torch.tensor([False, True, True]),
            behavior_logprobs=torch.zeros(n),
            versions=torch.zeros(n, dtype=torch.long),
            reward=0.0,
            item_index=item.index,
            metadata={"completion": "x", "reward_components": components[item.id]},
        )

    return episode


def test_evaluation_grades_each_domain_by_its_own_reward() -> None:
    def item(i: str, domain: str | None, correct_reward: str | None = None) -> Item:
        meta = {"domain": domain} if domain else {}
        if correct_reward:
            meta["correct_reward"] = correct_reward
        return Item(id=i, prompt="?", answer="1", metadata=meta)

    items = [
        item("a1", "add"),
        item("a2", "add"),
        item("m1", "mul", "exact_match"),
        item("m2", "mul", "exact_match"),
        item("m3", "mul", "exact_match"),
        item("plain", None),
    ]
    both = {"numeric_match": 1.0, "exact_match": 1.0}
    components = {
        "a1": {"numeric_match": 1.0, "exact_match": 0.0},  # correct (numeric_match)
        "a2": {"numeric_match": 0.0, "exact_match": 1.0},  # wrong
        "m1": {"numeric_match": 1.0, "exact_match": 0.0},  # wrong: mul uses exact_match
        "m2": both,  # correct
        "m3": {"numeric_match": 1.0},  # wrong: exact_match absent (not its domain)
        "plain": both,  # correct, and no domain metric
    }
    result = evaluate(None, scripted_episode(components), items, "numeric_match")
    assert [it["correct"] for it in result.items] == [
        [True],
        [False],
        [False],
        [True],
        [False],
        [True],
    ]
    assert result.accuracy == pytest.approx(3 / 6)
    assert result.metrics["accuracy/add"] == pytest.approx(1 / 2)
    assert result.metrics["accuracy/mul"] == pytest.approx(1 / 3)
    assert sorted(k for k in result.metrics if k.startswith("accuracy/")) == [
        "accuracy/add",
        "accuracy/mul",
    ]
    assert [it.get("domain") for it in result.items] == ["add", "add", "mul", "mul", "mul", None]
    # items without a domain: the metrics are exactly as before
    plain = evaluate(None, scripted_episode(components), [items[-1]], "numeric_match")
    assert set(plain.metrics) == {
        "accuracy",
        "n_items",
        "n_samples",
        "reward_failures",
        "episode_failures",
    }
    assert "domain" not in plain.items[0]

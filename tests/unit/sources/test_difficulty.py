"""Difficulty as a dimension of a task source: levels, set_level / at_level, items that
record their level, a held-out split that stays the task as configured, and a mixture
whose domains are the curriculum's tasks."""

from __future__ import annotations

import itertools

import pytest

from streamrl.sources import build_task_source
from streamrl.sources.base import LEVEL_KEY


def _first(source, n: int = 20) -> list:
    return list(itertools.islice(source.train_iter(0), n))


@pytest.mark.parametrize("kind", ["arithmetic", "tool_arithmetic", "longtail"])
def test_arithmetic_sources_have_a_level_per_operand_length(kind: str) -> None:
    source = build_task_source(kind, digits=3, heldout_size=10)
    assert source.levels == 3 and source.level is None
    for level in range(3):
        items = _first(source.at_level(level))
        assert {it.metadata[LEVEL_KEY] for it in items} == {level}
        assert max(max(it.metadata["operands"]) for it in items) < 10 ** (level + 1)
    assert source.level is None and LEVEL_KEY not in _first(source, 1)[0].metadata  # unchanged
    held = [it.id for it in source.heldout()]
    assert [it.id for it in source.at_level(0).heldout()] == held  # the task as configured


def test_a_reasoning_gym_task_has_its_curriculum_levels() -> None:
    source = build_task_source("reasoning_gym", task="basic_arithmetic", size=20, heldout_size=3)
    assert source.levels == 5  # num_terms 2..6 (num_digits has 4 levels)
    easy, hard = _first(source.at_level(0), 10), _first(source.at_level(4), 10)
    assert all(it.id.endswith(":L0") and it.metadata[LEVEL_KEY] == 0 for it in easy)
    assert {len(it.prompt) for it in easy} != {len(it.prompt) for it in hard}
    assert [it.id for it in source.at_level(3).heldout()] == [it.id for it in source.heldout()]
    held = {it.prompt for it in source.heldout()}
    assert not held & {it.prompt for it in easy + hard}  # the splits stay disjoint


@pytest.mark.parametrize("level", [-1, 3, 1.5, True])
def test_a_level_out_of_range_is_one_clear_line(level) -> None:
    with pytest.raises(
        ValueError, match=r"arithmetic: difficulty level must be an integer in \[0, 2\]"
    ):
        build_task_source("arithmetic", digits=3).set_level(level)


def test_a_source_without_a_knob_has_one_level_and_a_mixture_lists_its_domains() -> None:
    mixture = build_task_source(
        "mixture",
        sources=[
            {"name": "a", "kind": "arithmetic", "options": {"digits": 2}, "weight": 3},
            {"name": "b", "kind": "reasoning_gym", "options": {"task": "leg_counting"}},
        ],
    )
    assert mixture.levels == 1
    tasks = mixture.tasks()
    assert [(t.name, t.weight, t.source.levels) for t in tasks] == [("a", 3.0, 2), ("b", 1.0, 36)]
    item = tasks[0].tag(_first(tasks[0].source.at_level(1), 1)[0])
    assert item.id.startswith("a/arith:") and item.metadata["domain"] == "a"
    with pytest.raises(ValueError, match="must be an integer in \\[0, 0\\]"):
        mixture.set_level(1)

"""The ``code`` task source: enough distinct problems, deterministic, hidden tests that
never reach the prompt, and reference solutions that pass their own tests."""

from __future__ import annotations

import itertools
import json

import pytest

from streamrl.config.options import OptionsError
from streamrl.rollout.rewards import get_reward
from streamrl.rollout.rewards.code_harness import same
from streamrl.sources import build_task_source
from streamrl.sources.code_tasks import FAMILIES, CodeTaskSource
from tests.sandbox_corpus import require_strong


def all_items(source: CodeTaskSource):
    return [source.make_item(*fp) for fp in source.problems]


def prompt_text(item) -> str:
    return item.prompt if item.prompt is not None else item.messages[0]["content"]


def test_at_least_100_distinct_problems_split_and_deterministic():
    source = build_task_source("code")
    items = all_items(source)
    ids = [it.id for it in items]
    assert len(set(ids)) == len(ids) >= 100
    assert len({prompt_text(it) for it in items}) == len(items)
    held = {it.id for it in source.heldout()}
    train = {it.id for it in itertools.islice(source.train_iter(seed=0), 2000)}
    assert held and train and not held & train
    assert len(held) + len({fp for fp in source._train}) == len(items)
    again = build_task_source("code")
    assert [it.metadata for it in again.heldout()] == [it.metadata for it in source.heldout()]
    first = [it.id for it in itertools.islice(source.train_iter(seed=3), 50)]
    assert first == [it.id for it in itertools.islice(again.train_iter(seed=3), 50)]
    assert first != [it.id for it in itertools.islice(again.train_iter(seed=4), 50)]
    easy = build_task_source("code", difficulty=1)
    assert {it.metadata["level"] for it in all_items(easy)} == {1}
    assert {
        it.metadata["family"] for it in all_items(build_task_source("code", families="mod_k"))
    } == {"mod_k"}


@pytest.mark.parametrize("format", ["chat", "plain"])
def test_hidden_tests_never_reach_the_prompt(format):
    source = build_task_source("code", format=format, examples=2, tests=5)
    for item in all_items(source):
        text, tests = prompt_text(item), item.metadata["tests"]
        assert len(tests) == 5
        shown = text.count(f"{item.metadata['entry_point']}(") - 1  # minus the signature
        assert shown == 2
        for t in tests:
            call = f"{item.metadata['entry_point']}({', '.join(map(repr, t['args']))})"
            assert call not in text, (item.id, call)
        assert "reference" not in text and item.metadata["reference"] not in text
        json.dumps(tests)  # JSON data, as the harness gets them


def test_every_reference_solution_passes_its_own_tests():
    source = build_task_source("code")
    for item in all_items(source):
        namespace: dict = {}
        exec(item.metadata["reference"], namespace)  # our own code, not a model's
        fn = namespace[item.metadata["entry_point"]]
        for t in item.metadata["tests"]:
            assert same(json.loads(json.dumps(fn(*t["args"]))), t["expected"]), item.id


def test_references_pass_in_the_sandbox_through_the_reward():
    require_strong()
    reward = get_reward("unit_tests")
    for fmt in ("chat", "plain"):
        source = build_task_source("code", format=fmt)
        for fam in FAMILIES:  # one problem of each family
            item = source.make_item(fam, fam.params[0])
            code = item.metadata["reference"]
            if fmt == "plain":  # the completion is the body the prompt asks for
                code = code.split("\n", 1)[1]
            assert reward(code, item).value == 1.0, (fmt, item.id)


def test_bad_options_and_the_kind_list():
    with pytest.raises(OptionsError, match="difficulty"):
        build_task_source("code", difficulty=4)
    with pytest.raises(OptionsError, match="add_k"):
        build_task_source("code", families="no_such")
    with pytest.raises(ValueError, match="code"):
        build_task_source("no_such_kind")

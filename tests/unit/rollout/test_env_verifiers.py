"""verifiers environments inside the environment episode: the environment's own rollout
code (a real ``vf.SingleTurnEnv`` and a ``vf.MultiTurnEnv``) with streamrl's policy as
its model, its rubric's reward as the seat's return; a failing environment is counted."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from streamrl.models import build_char_tokenizer
from streamrl.sources import build_task_source
from tests.env_harness import ScriptedEngine, _episode

vf = pytest.importorskip("verifiers")
ARITHMETIC = "streamrl.rollout.envs.vf_arithmetic:arithmetic_env"


class Guess(vf.MultiTurnEnv):
    """Says "again" after each answer; three turns; the rubric pays 1 per right answer."""

    async def env_response(self, messages, state, **kwargs):
        if state.get("info", {}).get("fail"):
            raise ValueError("the environment broke")
        return [vf.UserMessage(content="again")]


def _right_answers(completion, answer, **kwargs) -> float:
    return float(sum(m["content"] == answer for m in completion if m["role"] == "assistant"))


def guess_env(fail: bool = False):
    from datasets import Dataset

    rows = [{"question": "1+1=", "answer": "2", "info": {"fail": fail}}] * 3
    return Guess(
        dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[_right_answers]), max_turns=3
    )


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_a_single_turn_environment_scores_with_its_rubric(tok):
    src = build_task_source("verifiers", load=ARITHMETIC, args={"train_size": 8, "eval_size": 4})
    items = src.heldout()
    assert len(items) == 4 and len(list(itertools.islice(src.train_iter(0), 8))) == 8
    item = items[0]
    prompt = asyncio.run(_first_prompt(tok, item))
    a, b = prompt.split("+")
    right = str(int(a) + int(b.rstrip("=")))
    for move, reward in [(right, 1.0), (right + "1", 0.0)]:
        out = asyncio.run(_episode(tok)(ScriptedEngine(tok, [move]), item, seed=0))
        [t] = out.trajectories
        assert t.reward == reward and t.metadata["turn_spans"] and out.metrics["env/turns"] == 1


async def _first_prompt(tok, item) -> str:
    from streamrl.rollout.envs import make_env

    env = make_env(item.metadata["env"])
    obs = await env.reset(0)
    await env.close()
    return obs.messages[-1]["content"]


def test_a_multi_turn_environment_replies_between_turns(tok):
    src = build_task_source("verifiers", load=f"{__name__}:guess_env", heldout_size=1)
    item = next(src.train_iter(0))
    engine = ScriptedEngine(tok, ["2", "3", "2"])
    out = asyncio.run(_episode(tok)(engine, item, seed=0))
    [t] = out.trajectories
    assert t.reward == 2.0 and len(t.metadata["turn_spans"]) == 3
    assert t.metadata["messages"][-2:] == [
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "2"},
    ]
    # the environment's replies are observation tokens: masked, no version
    text = tok.decode(t.input_ids[~t.loss_mask].tolist())
    assert text.count("again") == 2 and (t.versions[~t.loss_mask] == -1).all()


def test_a_failing_verifiers_environment_is_a_counted_failure(tok):
    src = build_task_source(
        "verifiers", load=f"{__name__}:guess_env", args={"fail": True}, heldout_size=1
    )
    out = asyncio.run(
        _episode(tok)(ScriptedEngine(tok, ["2"] * 3), next(src.train_iter(0)), seed=0)
    )
    assert out.trajectories == [] and out.metrics["env/errors/raised"] == 1


def test_a_loader_that_is_not_an_environment_is_one_clear_error():
    with pytest.raises(ValueError, match="not a vf.Environment"):
        build_task_source("verifiers", load="builtins:dict")

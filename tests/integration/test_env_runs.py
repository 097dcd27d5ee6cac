"""Real runs over text environments: self-play on TextArena's Kuhn Poker (one policy in
both seats, a trajectory per seat, role-conditioned advantages) and a verifiers
environment that fails on some rows (counted, the run goes on); every issued item is
accounted for."""

from __future__ import annotations

import pytest

from streamrl.run.launch import train
from tests.tiny_run import metric_rows

pytest.importorskip("textarena")
vf = pytest.importorskip("verifiers")

ENV_RUN = [
    "rollout.episode=env",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "train.items_per_step=2",
    "train.steps=2",
    "reward.components=[{name: env_return}, {name: env_win, weight: 0}]",
    "reward.correct_reward=env_win",
    "rollout.max_consecutive_failures=0",
]


def _accounted(s: dict) -> None:
    assert s["stream/issued"] == s["stream/consumed"] + s["stream/filtered"] + s["stream/failed"]


@pytest.mark.slow
def test_self_play_on_kuhn_poker_trains_both_seats(tiny_config) -> None:
    cfg = tiny_config(
        *ENV_RUN,
        "data.kind=textarena",
        "data.options={env_id: KuhnPoker-v0, env_options: {max_rounds: 1}, "
        "observe: [game_message, game_board], heldout_size: 4}",
        "env.max_total_tokens=200",
        "algorithm.name=rae",
    )
    result = train(cfg)
    s = result.summary
    _accounted(s)
    assert s["stream/consumed"] == 4
    rows = metric_rows(result.run_dir)
    assert sum(r.get("env/turns", 0) for r in rows) > 0
    assert any(k.endswith("vs_random") for r in rows for k in r), "no evaluation per opponent"


class Flaky(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        if state["info"]["fail"]:
            raise ValueError("the environment broke")
        return [vf.UserMessage(content="again")]


def flaky_env():
    from datasets import Dataset

    rows = [
        {"question": f"{k}+1=", "answer": str(k + 1), "info": {"fail": k % 2 == 0}}
        for k in range(8)
    ]
    return Flaky(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[_one]), max_turns=2)


def _one(completion, answer, **kwargs) -> float:
    return 1.0


@pytest.mark.slow
def test_a_failing_environment_is_counted_and_the_run_goes_on(tiny_config) -> None:
    cfg = tiny_config(
        *ENV_RUN,
        "data.kind=verifiers",
        f"data.options={{load: '{__name__}:flaky_env', heldout_size: 2}}",
        "algorithm.dynamic_sampling=false",
        "env.max_total_tokens=64",
    )
    result = train(cfg)
    s = result.summary
    _accounted(s)
    assert s["stream/consumed"] == 4
    assert s["stream/failed/env_error:raised"] > 0
    rows = metric_rows(result.run_dir)
    assert sum(r.get("env/errors/raised", 0) for r in rows) > 0

"""The environment episode (``rollout.episode: env``): one trajectory per policy seat,
token in, token out (observations masked, generated tokens with their log-probs and
versions), per-turn rewards; and the bad-input class: an environment that raises,
hangs, returns a malformed observation, a non-finite reward or never ends fails its
episode, counted as ``env/errors/<kind>``, and the rest of the group goes on."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from streamrl.core.types import Item
from streamrl.models import build_char_tokenizer
from streamrl.rollout.envs import Action, Observation, Step, register_env
from tests.env_harness import ScriptedEngine, _episode


class Countdown:
    """Two seats take turns; each move is echoed to the other seat; the game ends after
    ``turns`` moves. Seat 0 earns 0.5 on its first move (a turn-level reward); at the
    end, seat 0 gets +1 and seat 1 -1. ``fault`` breaks one part of the protocol."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.seats, self.turns, self.fault = 2, int(spec.get("turns", 4)), spec.get("fault")
        self.t = 0

    async def reset(self, seed: int) -> Observation:
        if self.fault == "reset_raises":
            raise RuntimeError("no such game")
        if self.fault == "reset_not_observation":
            return {"messages": []}  # type: ignore[return-value]
        return Observation([{"role": "user", "content": f"game {seed}: you are seat 0"}], 0)

    async def step(self, action: Action) -> Step:
        self.t += 1
        if self.fault == "step_raises" and self.t == 2:
            raise KeyError("bad move")
        if self.fault == "hang" and self.t == 2:
            await asyncio.sleep(30)
        if self.fault == "nan_reward":
            return Step(Observation([{"role": "user", "content": "x"}], 1), {0: math.nan}, False)
        if self.fault == "inf_reward" and self.t == 3:
            return Step(None, {0: math.inf, 1: 0.0}, True)
        if self.fault == "content_not_text":
            return Step(Observation([{"role": "user", "content": 3}], 1), {}, False)
        if self.fault == "bad_seat":
            return Step(Observation([{"role": "user", "content": "x"}], 7), {}, False)
        if self.t >= self.turns and self.fault != "never_ends":
            return Step(None, {0: 1.0, 1: -1.0}, True)
        rewards = {0: 0.5} if self.t == 1 else {}
        other = self.t % 2
        text = f"seat {1 - other} played {action.text}"
        return Step(Observation([{"role": "user", "content": text}], other), rewards, False)

    async def close(self) -> None:
        return None


register_env("test_countdown")(Countdown)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _item(seats=("policy", "policy"), **spec) -> Item:
    env = {"kind": "test_countdown", "id": "countdown", **spec}
    return Item(id="g", index=3, metadata={"env": env, "env_seed": 11, "seats": list(seats)})


def test_self_play_gives_one_trajectory_per_seat_token_in_token_out(tok):
    engine = ScriptedEngine(tok, ["a", "b", "c", "d"])
    out = asyncio.run(_episode(tok)(engine, _item(turns=4), seed=1))
    assert out.error is None and len(out.trajectories) == 2
    by_seat = {t.metadata["seat"]: t for t in out.trajectories}
    # seat 0 moved first (0.5 for it) and won (+1); seat 1 lost
    assert by_seat[0].reward == 1.5 and by_seat[1].reward == -1.0
    assert by_seat[0].metadata["turn_rewards"] == [0.5, 1.0]
    assert by_seat[1].metadata["turn_rewards"] == [0.0, -1.0]
    assert by_seat[0].metadata["role_key"] == "countdown/seat_0"
    for t in out.trajectories:
        mask = t.loss_mask
        assert (t.versions[mask] == 5).all() and (t.versions[~mask] == -1).all()
        assert (t.behavior_logprobs[mask] == -0.5).all() and (t.behavior_logprobs[~mask] == 0).all()
        spans = t.metadata["turn_spans"]
        assert len(spans) == 2 and sum(b - a for a, b in spans) == int(mask.sum())
        # a seat's turn was prompted with exactly its tokens so far: token in, token out
        prompts = [p for p in engine.prompts if t.input_ids[: len(p)].tolist() == p]
        assert len(prompts) == 2
    # seat 1 saw seat 0's move; seat 0 saw seat 1's
    assert "seat 0 played a" in tok.decode(by_seat[1].input_ids.tolist())
    assert "seat 1 played b" in tok.decode(by_seat[0].input_ids.tolist())
    assert out.metrics["env/turns"] == 4


def test_a_scripted_opponent_fills_the_other_seat(tok):
    engine = ScriptedEngine(tok, ["a", "c"])
    out = asyncio.run(_episode(tok)(engine, _item(("policy", "random"), turns=4), seed=1))
    assert [t.metadata["seat"] for t in out.trajectories] == [0]
    assert out.trajectories[0].reward == 1.5 and not engine.moves


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("reset_raises", "raised"),
        ("step_raises", "raised"),
        ("reset_not_observation", "malformed"),
        ("content_not_text", "malformed"),
        ("bad_seat", "malformed"),
        ("nan_reward", "non_finite_reward"),
        ("inf_reward", "non_finite_reward"),
        ("never_ends", "max_turns"),
        ("hang", "timeout"),
    ],
)
def test_a_broken_environment_fails_its_episode_counted(tok, fault, kind):
    episode = _episode(tok, max_turns=6, step_timeout_s=0.2)
    engine = ScriptedEngine(tok, ["m"] * 10)
    out = asyncio.run(episode(engine, _item(turns=4, fault=fault), seed=1))
    assert out.trajectories == [] and out.error == f"env_error:{kind}"
    assert out.metrics[f"env/errors/{kind}"] == 1


def test_an_unknown_environment_kind_is_a_counted_failure(tok):
    item = Item(id="g", metadata={"env": {"kind": "nope"}, "env_seed": 0, "seats": ["policy"]})
    out = asyncio.run(_episode(tok)(ScriptedEngine(tok, []), item, seed=1))
    assert out.error == "env_error:raised" and out.metrics["env/errors/raised"] == 1


def test_a_seat_out_of_tokens_is_truncated_not_trained_on(tok):
    out = asyncio.run(
        _episode(tok, max_total_tokens=40)(ScriptedEngine(tok, ["a"] * 4), _item(), seed=1)
    )
    assert out.trajectories == [] and out.metrics["env/truncated"] == 1

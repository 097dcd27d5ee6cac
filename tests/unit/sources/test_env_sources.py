"""Environment task sources: TextArena games (real Kuhn Poker and TicTacToe through the
adapter), their held-out games against fixed opponents, the unknown-kind error, and a
missing ``streamrl[envs]`` extra named in one clear error."""

from __future__ import annotations

import asyncio
import builtins
import random

import pytest

from streamrl.models import build_char_tokenizer
from streamrl.rollout.envs import get_opponent, make_env
from streamrl.sources import build_task_source, task_source_kinds
from tests.env_harness import ScriptedEngine, _episode

pytest.importorskip("textarena")
KUHN = {"env_id": "KuhnPoker-v0", "env_options": {"max_rounds": 1}}


def test_environment_kinds_are_listed_in_the_unknown_kind_error():
    assert {"openenv", "textarena", "verifiers"} <= set(task_source_kinds())
    with pytest.raises(ValueError, match="openenv.*textarena.*verifiers"):
        build_task_source("no_such_kind")


def test_heldout_games_alternate_opponents_and_the_policys_seat():
    src = build_task_source("textarena", **KUHN, eval_opponents=["random", "kuhn_heuristic"])
    seats = [it.metadata["seats"] for it in src.heldout(4)]
    assert seats == [
        ["policy", "random"],
        ["policy", "kuhn_heuristic"],
        ["random", "policy"],
        ["kuhn_heuristic", "policy"],
    ]
    again = [it.metadata["env_seed"] for it in src.heldout(4)]
    assert again == [it.metadata["env_seed"] for it in src.heldout(4)]  # fixed games


def test_a_kuhn_poker_game_depends_on_its_seed_alone():
    src = build_task_source("textarena", **KUHN)
    item = next(src.train_iter(0))

    async def deal() -> str:
        env = make_env(item.metadata["env"])
        obs = await env.reset(item.metadata["env_seed"])
        return obs.messages[-1]["content"]

    first = asyncio.run(deal())
    random.seed(123)  # the global generator does not move the game
    assert asyncio.run(deal()) == first and "Your card is" in first


def test_self_play_on_real_kuhn_poker_is_zero_sum_over_the_seats():
    tok = build_char_tokenizer()
    src = build_task_source("textarena", **KUHN, observe=["game_message", "game_board"])
    episode = _episode(tok, max_total_tokens=400)
    for item in [next(src.train_iter(s)) for s in range(3)]:
        out = asyncio.run(episode(ScriptedEngine(tok, ["[check]"] * 2), item, seed=0))
        # check, check: a showdown; one seat wins +1, the other loses -1
        assert sorted(t.reward for t in out.trajectories) == [-1.0, 1.0]
        assert {t.metadata["role_key"] for t in out.trajectories} == {
            "KuhnPoker-v0/seat_0",
            "KuhnPoker-v0/seat_1",
        }


def test_an_invalid_move_loses_the_game_and_is_not_a_failure():
    tok = build_char_tokenizer()
    src = build_task_source(
        "textarena", **KUHN, seats=["policy", "random"], observe=["game_message", "game_board"]
    )
    item = next(src.train_iter(0))
    out = asyncio.run(_episode(tok, max_total_tokens=2000)(ScriptedEngine(tok, ["?"] * 8), item, 0))
    assert out.error is None and [t.reward for t in out.trajectories] == [-1.0]


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_an_invalid_move_that_ends_the_game_costs_the_penalty_on_top(penalty: float):
    tok = build_char_tokenizer()
    src = build_task_source("textarena", **KUHN, invalid_move_penalty=penalty)
    item = next(src.train_iter(0))
    out = asyncio.run(_episode(tok, max_total_tokens=2000)(ScriptedEngine(tok, ["?"] * 8), item, 0))
    # seat 1 opens; its second invalid move ends the game; seat 0 never moved
    (t,) = out.trajectories
    assert t.metadata["seat"] == 1 and t.reward == -1.0 - penalty
    with pytest.raises(Exception, match="invalid_move_penalty must be >= 0"):
        build_task_source("textarena", **KUHN, invalid_move_penalty=-1)


def test_a_random_teachers_demonstrations_are_random():
    """Each demonstration's teacher draws from its own item's generator: a random teacher
    does not play one fixed move per situation (it did with one seed for every game)."""
    tok = build_char_tokenizer()
    src = build_task_source("textarena", **KUHN, demonstration="random")
    episode = _episode(tok, max_total_tokens=2000)
    items = [it for _, it in zip(range(24), src.train_iter(0), strict=False)]
    demos = [episode.replay(it).metadata for it in items]
    openings = [d["messages"][1]["content"] for d in demos if d["seat"] == 1]  # seat 1 opens
    assert len(openings) >= 6 and set(openings) == {"[check]", "[bet]"}
    assert [episode.replay(it).metadata for it in items] == demos  # each item's is fixed


def test_tictactoe_plays_against_a_random_opponent():
    tok = build_char_tokenizer()
    src = build_task_source(
        "textarena", env_id="TicTacToe-v0", seats=["policy", "random"], observe=["game_board"]
    )
    item = next(src.train_iter(0))
    moves = [f"[{k}]" for k in range(9)]
    out = asyncio.run(_episode(tok, max_total_tokens=2000)(ScriptedEngine(tok, moves), item, 0))
    assert out.error is None and len(out.trajectories) == 1
    assert get_opponent("random")([], ("[4]",), random.Random(0)) == "[4]"


def test_a_missing_extra_is_one_error_naming_it(monkeypatch):
    real_import = builtins.__import__

    def no_textarena(name, *args, **kwargs):
        if name.split(".")[0] == "textarena":
            raise ImportError("No module named 'textarena'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_textarena)
    monkeypatch.delitem(__import__("sys").modules, "textarena")
    with pytest.raises(ValueError, match=r"pip install 'streamrl\[envs\]'"):
        build_task_source("textarena", **KUHN)

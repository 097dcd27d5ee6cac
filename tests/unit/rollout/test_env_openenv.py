"""OpenEnv environments inside the environment episode: an in-process OpenEnv
``Environment`` (a digit-guessing game on the library's base classes), its per-step
rewards, and its failures counted."""

from __future__ import annotations

import asyncio
import math

import pytest

from streamrl.models import build_char_tokenizer
from streamrl.sources import build_task_source
from tests.env_harness import ScriptedEngine, _episode

# (openenv-core 0.3 imports fastmcp's client, which needs mcp >= 2)
core = pytest.importorskip("openenv.core", exc_type=ImportError)


class Guess(core.Action):
    guess: str


class Reply(core.Observation):
    text: str


class DigitGame(core.Environment):
    """Guess the digit ``seed % 10``: "higher"/"lower" after a miss (reward -0.1), 1 on
    a hit; ``broken`` returns a non-finite reward instead."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.broken, self.secret, self.turns = broken, 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> Reply:
        self.secret, self.turns = (seed or 0) % 10, 0
        return Reply(text="guess a digit")

    def step(self, action: Guess, timeout_s=None, **kwargs) -> Reply:
        self.turns += 1
        if self.broken:
            return Reply(text="?", reward=math.nan)
        if action.guess.strip() == str(self.secret):
            return Reply(text="yes", reward=1.0, done=True)
        hint = "higher" if action.guess.strip() < str(self.secret) else "lower"
        return Reply(text=hint, reward=-0.1, done=self.turns >= 3)

    @property
    def state(self) -> core.State:
        return core.State(step_count=self.turns)


SPEC = {
    "load": f"{__name__}:DigitGame",
    "action": f"{__name__}:Guess",
    "action_field": "guess",
    "observation_field": "text",
}


def _item(**args):
    src = build_task_source("openenv", **SPEC, args=args, heldout_size=2)
    item = src.heldout()[0]  # seed 1_000_000: the digit 0
    return item


def test_an_openenv_environment_plays_turn_by_turn_with_step_rewards():
    tok = build_char_tokenizer()
    out = asyncio.run(_episode(tok)(ScriptedEngine(tok, ["5", "0"]), _item(), seed=0))
    [t] = out.trajectories
    assert t.metadata["turn_rewards"] == [-0.1, 1.0] and t.reward == pytest.approx(0.9)
    assert "lower" in tok.decode(t.input_ids[~t.loss_mask].tolist())


def test_a_non_finite_openenv_reward_is_a_counted_failure():
    tok = build_char_tokenizer()
    out = asyncio.run(_episode(tok)(ScriptedEngine(tok, ["5"]), _item(broken=True), seed=0))
    assert out.trajectories == [] and out.metrics["env/errors/non_finite_reward"] == 1


def test_a_wrong_action_field_is_one_clear_error():
    with pytest.raises(ValueError, match="no field 'move'"):
        build_task_source("openenv", **{**SPEC, "action_field": "move"})

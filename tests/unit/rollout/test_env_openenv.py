"""OpenEnv environments inside the environment episode: a digit-guessing game on the
library's base classes, in-process and served by OpenEnv's own server app (uvicorn on a
loopback port, stepped through OpenEnv's client), its per-step rewards, and its failures
counted (a non-finite reward, a server that dies mid-episode, one that is gone)."""

from __future__ import annotations

import asyncio
import importlib
import math
import sys
import threading
import time

import pytest

from streamrl.models import build_char_tokenizer
from streamrl.sources import build_task_source
from tests.env_harness import ScriptedEngine, _episode

# skipped only without the extra; installed, a broken install (openenv.core's imports,
# fastmcp's client among them: pyproject's envs extra pins them) fails here, not skips
pytest.importorskip("openenv", reason="the envs extra (openenv-core) is not installed")
core = importlib.import_module("openenv.core")
uvicorn = importlib.import_module("uvicorn")


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


class LoopbackServer:
    """OpenEnv's server app for :class:`DigitGame` under uvicorn on 127.0.0.1 (a free
    port), on its own thread and event loop; :meth:`kill` drops it as a crash would:
    every connection reset, the port closed."""

    def __init__(self) -> None:
        app = core.create_app(DigitGame, Guess, Reply)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical")
        self.server, self.loop = uvicorn.Server(config), asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self.server.serve(),), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no server"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def _crash(self) -> None:
        for listener in self.server.servers:
            listener.close()
        for connection in list(self.server.server_state.connections):
            connection.transport.abort()
        self.server.should_exit = True  # (its lifespan ends as it would)

    def kill(self) -> None:
        self.loop.call_soon_threadsafe(self._crash)
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.loop.close()


@pytest.fixture
def server():
    served = LoopbackServer()
    yield served
    if served.thread.is_alive():
        served.kill()


def _remote_item(url: str):
    spec = {**SPEC, "url": url}
    del spec["load"]
    return build_task_source("openenv", **spec, heldout_size=1).heldout()[0]


class KillingEngine(ScriptedEngine):
    """Kills the server before its ``at``-th move: the episode's next step finds it dead."""

    def __init__(self, tokenizer, moves, server, at: int) -> None:
        super().__init__(tokenizer, moves)
        self.server, self.at = server, at

    async def agenerate(self, request):
        if len(self.prompts) + 1 == self.at:
            await asyncio.to_thread(self.server.kill)
        return await super().agenerate(request)


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


def test_an_openenv_server_on_a_loopback_port_plays_through_its_client(server):
    tok = build_char_tokenizer()
    item = _remote_item(server.url)
    out = asyncio.run(_episode(tok)(ScriptedEngine(tok, ["5", "0"]), item, seed=0))
    [t] = out.trajectories
    assert t.metadata["turn_rewards"] == [-0.1, 1.0] and t.reward == pytest.approx(0.9)
    assert "lower" in tok.decode(t.input_ids[~t.loss_mask].tolist())
    assert out.metrics["env/turns"] == 2


def test_a_server_that_dies_mid_episode_is_a_counted_failure_and_the_run_goes_on(server):
    tok = build_char_tokenizer()
    item = _remote_item(server.url)
    engine = KillingEngine(tok, ["5", "4", "0"], server, at=2)
    out = asyncio.run(_episode(tok, step_timeout_s=20)(engine, item, seed=0))
    assert out.trajectories == [] and out.error == "env_error:raised"
    assert out.metrics["env/errors/raised"] == 1 and out.metrics["env/turns"] == 1
    # the next episode finds the server gone: counted the same way, nothing raised
    again = asyncio.run(_episode(tok, step_timeout_s=20)(ScriptedEngine(tok, ["0"]), item, 0))
    assert again.trajectories == [] and again.metrics["env/errors/raised"] == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"url": "http://127.0.0.1:9"}, "one of load"),  # and load: both
        ({"load": None}, "one of load"),  # neither
        ({"load": None, "url": "127.0.0.1:8000"}, "is not http"),
        ({"load": None, "url": "ftp://127.0.0.1:8000"}, "is not http"),
        ({"load": None, "url": "http://127.0.0.1:9", "action_field": "move"}, "no field"),
    ],
)
def test_a_bad_source_spec_is_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        build_task_source("openenv", **{**SPEC, **options})


@pytest.mark.parametrize("where", [{}, {"load": None, "url": "http://127.0.0.1:9"}])
def test_without_the_extra_the_error_names_it(monkeypatch, where):
    monkeypatch.setitem(sys.modules, "openenv.core", None)  # as if not installed
    with pytest.raises(ValueError, match=r"pip install 'streamrl\[envs\]'"):
        build_task_source("openenv", **{**SPEC, **where})

"""OpenEnv environments through the text-environment protocol (``env.kind: openenv``).

An OpenEnv environment (``reset(seed)`` and ``step(action)`` returning an observation
with ``reward`` and ``done``): the policy's move goes into the action's
``action_field``, the observation's ``observation_field`` is what the policy sees next
(a user message), and each step's ``reward`` is the seat's.

In-process (``load``), the environment's calls run on a thread (a synchronous
environment cannot stall the rollout worker; its hang is a timeout). Behind a server
(``url``), each episode is one session of OpenEnv's client (``GenericEnvClient``, a
WebSocket to the server's ``/ws``); a server that dies or drops the session fails the
episode (``env/errors/raised``; a silent one: ``timeout``).
"""

from __future__ import annotations

from typing import Any

from streamrl.rollout.envs.base import Action, EnvError, Observation, Step, in_thread
from streamrl.rollout.envs.registry import register_env
from streamrl.sources.environments import require
from streamrl.sources.openenv import KIND, action_type, build_environment


def _field(obs: Any, name: str) -> Any:
    """An observation's field: an attribute of a typed one, a key of a client's dict."""
    return obs.get(name) if isinstance(obs, dict) else getattr(obs, name, None)


def _observation(obs: Any, name: str) -> Observation:
    text = _field(obs, name)
    if not isinstance(text, str):
        raise EnvError("malformed", f"observation.{name} is {type(text).__name__}")
    return Observation([{"role": "user", "content": text}], 0)


def _step(obs: Any, reward: Any, done: Any, name: str) -> Step:
    """The protocol's step from an OpenEnv result (a missing reward: none this step;
    a bool reward counts 0 or 1)."""
    if reward is not None and not isinstance(reward, int | float):
        raise EnvError("malformed", f"reward {reward!r:.40} is not a number")
    rewards = {} if reward is None else {0: float(reward)}
    if done:
        return Step(None, rewards, True)
    return Step(_observation(obs, name), rewards, False)


class OpenEnvEnv:
    """An in-process OpenEnv ``Environment``."""

    seats = 1

    def __init__(self, spec: dict[str, Any]) -> None:
        self.env, self.action = build_environment(spec)
        self.action_field, self.field = spec["action_field"], spec["observation_field"]

    async def reset(self, seed: int) -> Observation:
        return _observation(await in_thread(self.env.reset, seed=seed), self.field)

    async def step(self, action: Action) -> Step:
        obs = await in_thread(self.env.step, self.action(**{self.action_field: action.text}))
        return _step(obs, obs.reward, obs.done, self.field)

    async def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            await in_thread(close)


class RemoteOpenEnv:
    """An OpenEnv server's environment, one session of its client per episode."""

    seats = 1

    def __init__(self, spec: dict[str, Any]) -> None:
        core = require("openenv.core", KIND)
        self.client = core.GenericEnvClient(base_url=spec["url"])
        self.action = action_type(spec)
        self.action_field, self.field = spec["action_field"], spec["observation_field"]

    async def reset(self, seed: int) -> Observation:
        result = await self.client.reset(seed=seed)
        return _observation(result.observation, self.field)

    async def step(self, action: Action) -> Step:
        move: Any = {self.action_field: action.text}
        if self.action is not None:  # validated here, as the server will
            move = self.action(**move)
        result = await self.client.step(move)
        return _step(result.observation, result.reward, result.done, self.field)

    async def close(self) -> None:
        await self.client.close()


@register_env(KIND)
def _openenv(spec: dict[str, Any]) -> OpenEnvEnv | RemoteOpenEnv:
    return RemoteOpenEnv(spec) if spec.get("url") else OpenEnvEnv(spec)

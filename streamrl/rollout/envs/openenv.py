"""OpenEnv environments through the text-environment protocol (``env.kind: openenv``).

An in-process OpenEnv ``Environment`` (``reset(seed)`` and ``step(action)`` returning an
``Observation`` with ``reward`` and ``done``): the policy's move goes into the action's
``action_field``, the observation's ``observation_field`` is what the policy sees next
(a user message), and each step's ``reward`` is the seat's. The environment's calls
run on a thread (a synchronous environment cannot stall the rollout worker; its hang is
a timeout).
"""

from __future__ import annotations

from typing import Any

from streamrl.rollout.envs.base import Action, EnvError, Observation, Step, in_thread
from streamrl.rollout.envs.registry import register_env
from streamrl.sources.openenv import KIND, build_environment


class OpenEnvEnv:
    seats = 1

    def __init__(self, spec: dict[str, Any]) -> None:
        self.env, self.action = build_environment(spec)
        self.action_field, self.field = spec["action_field"], spec["observation_field"]

    def _text(self, obs: Any) -> Observation:
        text = getattr(obs, self.field, None)
        if not isinstance(text, str):
            raise EnvError("malformed", f"observation.{self.field} is {type(text).__name__}")
        return Observation([{"role": "user", "content": text}], 0)

    async def reset(self, seed: int) -> Observation:
        return self._text(await in_thread(self.env.reset, seed=seed))

    async def step(self, action: Action) -> Step:
        move = self.action(**{self.action_field: action.text})
        obs = await in_thread(self.env.step, move)
        reward = {} if obs.reward is None else {0: float(obs.reward)}  # (a bool: 0 or 1)
        if obs.done:
            return Step(None, reward, True)
        return Step(self._text(obs), reward, False)

    async def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            await in_thread(close)


@register_env(KIND)
def _openenv(spec: dict[str, Any]) -> OpenEnvEnv:
    return OpenEnvEnv(spec)

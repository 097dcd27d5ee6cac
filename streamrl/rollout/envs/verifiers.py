"""verifiers environments through the text-environment protocol (``env.kind: verifiers``).

A ``vf.Environment`` (single-turn or multi-turn) runs its own rollout code: its prompt,
its ``env_response`` between turns, its stop conditions and its rubric. Only the model
is ours: the environment's client is a bridge (:class:`EpisodeClient`) whose every
model call becomes an observation of the environment episode and waits for the
policy's move, generated token in, token out by streamrl's engine. When the rollout
ends, its rubric's reward is the seat's reward (``env_return``).

An environment's rollout raising, or ending with an ``error`` in its state, fails the
episode (``env/errors/raised``), like any environment's failure.

The environment is built once per process and kept (verifiers environments hold no
per-rollout state: that is in each rollout's ``State``): ``load`` is a verifiers
environment id (``vf.load_environment``) or ``module:function`` returning one, with
``args`` its keyword arguments.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from streamrl.rollout.envs.base import Action, EnvError, Observation, Step
from streamrl.rollout.envs.registry import register_env
from streamrl.sources.verifiers import KIND, load_environment, rows


def _message(m: Any) -> dict[str, Any]:
    d = m.model_dump() if hasattr(m, "model_dump") else dict(m)
    return {"role": d.get("role"), "content": d.get("content")}


def _client_class() -> type:
    from verifiers.legacy.clients.client import Client
    from verifiers.legacy.types import ClientConfig, Response, ResponseMessage

    class EpisodeClient(Client):
        """A verifiers client whose model is the environment episode: each call hands
        the prompt to the episode and returns the policy's move as the response."""

        def __init__(self) -> None:
            super().__init__(None)
            self.events: asyncio.Queue = asyncio.Queue()  # ("prompt", messages) | ("done", out)
            self.moves: asyncio.Queue = asyncio.Queue()

        def setup_client(self, config: ClientConfig) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            await self.events.put(("prompt", list(prompt)))
            return await self.moves.get()

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: str) -> Any:
            message = ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
            return Response(id="streamrl", created=int(time.time()), model=KIND, message=message)

        async def close(self) -> None:
            return None

    return EpisodeClient


class VerifiersEnv:
    """One rollout of a verifiers environment on row ``index`` of its ``split``."""

    seats = 1

    def __init__(self, spec: dict[str, Any]) -> None:
        self.env = load_environment(spec)
        data = rows(self.env, spec.get("split", "train"))
        if data is None:
            raise ValueError(f"{spec['load']!r} has no {spec.get('split', 'train')} dataset")
        self.row = data[int(spec["index"])]
        self.client = _client_class()()
        self.task: asyncio.Task | None = None
        self.seen = 0  # messages of the environment's last prompt

    async def _rollout(self) -> None:
        row = self.row
        rollout_input = {"prompt": row["prompt"], "example_id": row.get("example_id", 0)}
        for key in ("answer", "info", "task"):
            if key in row and row[key] is not None:
                rollout_input[key] = row[key]
        out = await self.env.run_rollout(rollout_input, self.client, KIND, {})
        await self.client.events.put(("done", out))

    async def _next(self) -> tuple[str, Any]:
        """The environment's next model call or its end (its failure raises here)."""
        events = asyncio.ensure_future(self.client.events.get())
        done, _ = await asyncio.wait({events, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if events in done:
            return events.result()
        events.cancel()
        self.task.result()  # (raises the rollout's exception)
        raise EnvError("malformed", "the verifiers rollout ended without a result")

    def _observation(self, prompt: list[Any], start: int) -> Observation:
        self.seen = len(prompt)
        return Observation([_message(m) for m in prompt[start:]], 0)

    async def reset(self, seed: int) -> Observation:
        self.task = asyncio.ensure_future(self._rollout())
        kind, payload = await self._next()
        if kind != "prompt":
            raise EnvError("malformed", "the verifiers rollout ended before the model's turn")
        return self._observation(payload, 0)

    async def step(self, action: Action) -> Step:
        await self.client.moves.put(action.text)
        kind, payload = await self._next()
        if kind == "prompt":  # the environment replied: what follows our own turn
            return Step(self._observation(payload, self.seen + 1), {}, False)
        if payload.get("error"):
            raise RuntimeError(f"the verifiers rollout failed: {payload['error']}")
        return Step(None, {0: float(payload.get("reward") or 0.0)}, True)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


@register_env(KIND)
def _verifiers(spec: dict[str, Any]) -> VerifiersEnv:
    return VerifiersEnv(spec)

"""The text-environment protocol, what adapters implement and the environment episode
(``rollout.episode: env``) plays.

An environment has one or more *seats* (players) that act in turn::

    obs = await env.reset(seed)          # Observation: who acts first, what they see
    step = await env.step(Action(text))  # the acting seat's move
    step.rewards                         # {seat: reward earned in this step}
    step.done, step.observation          # the next seat to act and what it sees
    await env.close()

Observations are chat messages (``{"role": ..., "content": ...}``): at reset the task
for the first seat to act (a system and/or user message); after a step the
environment's reply to the seat that acts next, appended to that seat's conversation.
A single-agent environment has one seat, 0. Rewards come per step: a turn's reward is
credited to the seat's latest turn; a game's outcome arrives in its last step.

Every call of the protocol is guarded by :func:`guarded` and every result checked by
:func:`check_observation` / :func:`check_step`: an environment that raises, hangs,
returns a malformed observation or a non-finite reward raises :class:`EnvError` with
its ``kind``, which the episode counts (``env/errors/<kind>``) instead of crashing.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: the kinds of environment failure (``env/errors/<kind>``)
ERROR_KINDS = ("raised", "timeout", "malformed", "non_finite_reward", "max_turns")


class EnvError(RuntimeError):
    """An environment failure of one ``kind`` (:data:`ERROR_KINDS`), with what happened."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown environment error kind {kind!r}")
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass
class Observation:
    """What the seat that acts next sees: new chat messages for its conversation, and
    the actions the environment lists as legal (a scripted opponent picks from them;
    empty when the environment lists none)."""

    messages: list[dict[str, str]]
    seat: int = 0
    actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """A seat's move: the assistant message's text (stop string and stop token removed),
    and the tokens as generated (empty for a scripted opponent)."""

    text: str
    seat: int = 0
    token_ids: tuple[int, ...] = ()


@dataclass
class Step:
    """What one step returns: each seat's reward for it, whether the episode ended, the
    next observation (None once done) and the environment's extra information."""

    observation: Observation | None
    rewards: dict[int, float]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(Protocol):
    """An environment over text (see the module docstring). ``seats``: how many players."""

    seats: int

    async def reset(self, seed: int) -> Observation: ...

    async def step(self, action: Action) -> Step: ...

    async def close(self) -> None: ...


async def guarded(call: Awaitable[T], timeout_s: float, what: str) -> T:
    """``await call`` within ``timeout_s``; an exception becomes ``EnvError("raised")``,
    a timeout ``EnvError("timeout")`` (a synchronous library call must run in a thread,
    :func:`in_thread`, for its timeout to fire)."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except EnvError:
        raise
    except (TimeoutError, asyncio.TimeoutError):  # (distinct classes before Python 3.11)
        raise EnvError("timeout", f"{what} took longer than {timeout_s:g}s") from None
    except Exception as e:
        raise EnvError("raised", f"{what} raised {type(e).__name__}: {e}") from e


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A synchronous library call on a worker thread, so that a hang cannot stall the
    rollout worker's event loop (it is abandoned when its timeout fires)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list):
        raise EnvError("malformed", f"{where}: messages must be a list, got {type(messages)}")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise EnvError("malformed", f"{where}: messages[{i}] has no text 'role': {m!r:.80}")
        if not isinstance(m.get("content"), str):
            raise EnvError("malformed", f"{where}: messages[{i}].content is not text: {m!r:.80}")


def check_observation(obs: Any, seats: int, where: str = "reset") -> Observation:
    """``obs`` if it is an :class:`Observation` of a seat in ``range(seats)`` with chat
    messages of text; ``EnvError("malformed")`` naming what is wrong otherwise."""
    if not isinstance(obs, Observation):
        raise EnvError("malformed", f"{where}: expected an Observation, got {type(obs).__name__}")
    if isinstance(obs.seat, bool) or not isinstance(obs.seat, int) or not 0 <= obs.seat < seats:
        raise EnvError("malformed", f"{where}: seat {obs.seat!r} is not one of {seats} seats")
    _check_messages(obs.messages, where)
    return obs


def check_step(step: Any, seats: int) -> Step:
    """``step`` if well-formed: its rewards finite numbers of existing seats, and an
    observation unless done; ``EnvError("malformed" | "non_finite_reward")`` otherwise."""
    if not isinstance(step, Step):
        raise EnvError("malformed", f"step: expected a Step, got {type(step).__name__}")
    if not isinstance(step.rewards, dict):
        raise EnvError("malformed", f"step: rewards must be a dict, got {type(step.rewards)}")
    for seat, r in step.rewards.items():
        if isinstance(seat, bool) or not isinstance(seat, int) or not 0 <= seat < seats:
            raise EnvError("malformed", f"step: a reward for seat {seat!r} of {seats}")
        if isinstance(r, bool) or not isinstance(r, int | float):
            raise EnvError("malformed", f"step: seat {seat}'s reward {r!r} is not a number")
        if not math.isfinite(r):
            raise EnvError("non_finite_reward", f"step: seat {seat}'s reward is {r}")
    if not step.done:
        check_observation(step.observation, seats, "step")
    return step

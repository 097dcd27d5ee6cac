"""Environment adapters by kind: ``make_env(spec)`` builds the environment an item names.

An item of an environment task source carries, in its metadata::

    env       {"kind": "textarena", ...}  the adapter and its options (plain data)
    env_seed  int                          the seed the environment resets with
    seats     ["policy", "random"]         who plays each seat (opponents.py)

Register an adapter with ``@register_env("kind")`` on ``factory(spec) -> TextEnv``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.rollout.envs.base import TextEnv

EnvFactory = Callable[[dict[str, Any]], TextEnv]
_ENVS: dict[str, EnvFactory] = {}

ENV_KEY, SEED_KEY, SEATS_KEY = "env", "env_seed", "seats"  # item.metadata keys


def register_env(kind: str) -> Callable[[EnvFactory], EnvFactory]:
    def decorator(factory: EnvFactory) -> EnvFactory:
        if kind in _ENVS and _ENVS[kind] is not factory:
            raise ValueError(f"environment kind {kind!r} is already registered")
        _ENVS[kind] = factory
        return factory

    return decorator


def env_kinds() -> list[str]:
    return sorted(_ENVS)


def make_env(spec: dict[str, Any]) -> TextEnv:
    """The environment ``spec`` describes (a fresh one: environments are not shared)."""
    kind = spec.get("kind")
    if kind not in _ENVS:
        raise ValueError(f"unknown environment kind {kind!r}; known: {', '.join(env_kinds())}")
    return _ENVS[kind](spec)

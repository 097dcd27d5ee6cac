"""Gymnasium environments as a task source (``data.kind: gym``).

An item is a request for one trajectory *segment*: ``segment_length`` steps of
``num_envs`` vectorised environments, which the rollout worker plays with its
policy (``rollout.episode: gym``). Environments live in the worker and continue from
segment to segment, so an item carries no state; held-out items are evaluation
episodes (one deterministic episode each, seeded by its index).

Options:
    env_id:          a registered Gymnasium id, e.g. "CartPole-v1" (unknown ids fail here)
    env_options:     keyword arguments of ``gymnasium.make``
    num_envs:        environments per rollout worker
    segment_length:  steps per segment (per environment)
    vectorization:   "sync" | "async" (gymnasium.vector) | "envpool" (if installed)

>>> src = GymTaskSource("CartPole-v1", num_envs=2, segment_length=4)
>>> src.action_space, next(src.train_iter(0)).metadata["segment_length"]
(Discrete(2), 4)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource

VECTORIZATIONS = ("sync", "async", "envpool")


def make_env(env_id: str, env_options: dict[str, Any] | None = None) -> Any:
    import gymnasium as gym

    try:
        return gym.make(env_id, **(env_options or {}))
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, ...
        raise ValueError(f"data.options.env_id={env_id!r}: {e}") from None
    except TypeError as e:
        raise ValueError(f"data.options.env_options for {env_id!r}: {e}") from None


def make_vector_env(
    env_id: str, num_envs: int, vectorization: str, env_options: dict[str, Any] | None = None
) -> Any:
    """``num_envs`` copies; an environment resets in the step its episode ends and the
    final observation comes in ``info["final_obs"]`` (gymnasium's same-step autoreset)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    if vectorization == "envpool":
        return EnvPoolVectorEnv(env_id, num_envs, env_options)
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode=vectorization,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **({"kwargs": env_options} if env_options else {}),
    )


class EnvPoolVectorEnv:
    """EnvPool's C++ vectorised environments with gymnasium's same-step autoreset.

    EnvPool resets a finished environment on the *next* step (which then returns its
    first observation and reward 0). Here a finished environment is reset at once
    through ``reset(env_ids)``: the step returns the new episode's first observation and
    the final one in ``info["final_obs"]``, as the gymnasium vector envs do. EnvPool
    takes its seed at construction, so the pool is built on the first ``reset(seed=)``.
    """

    def __init__(self, env_id: str, num_envs: int, env_options: dict[str, Any] | None) -> None:
        try:
            import envpool
        except ImportError:
            raise ValueError(
                "data.options.vectorization=envpool needs `pip install streamrl[envpool]`"
            ) from None
        self._make = lambda seed: envpool.make_gymnasium(
            env_id, num_envs=num_envs, seed=seed, **(env_options or {})
        )
        probe = self._make(0)
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.num_envs = num_envs
        self._pool: Any = probe

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self._pool.close()
            self._pool = self._make(int(seed))
        obs, info = self._pool.reset()
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        obs, reward, term, trunc, info = self._pool.step(np.asarray(actions))
        done = np.logical_or(term, trunc)
        if done.any():
            ids = np.nonzero(done)[0]
            info = dict(info)
            info["final_obs"] = np.array(obs, copy=True)
            info["_final_obs"] = done
            obs = np.array(obs, copy=True)
            obs[ids] = self._pool.reset(ids)[0]
        return obs, reward, term, trunc, info

    def close(self) -> None:
        self._pool.close()


class GymTaskSource(TaskSource):
    def __init__(
        self,
        env_id: str,
        env_options: dict[str, Any] | None = None,
        num_envs: int = 8,
        segment_length: int = 32,
        vectorization: str = "sync",
        heldout_size: int = 10,
    ) -> None:
        if num_envs < 1 or segment_length < 1:
            raise ValueError("num_envs and segment_length must be >= 1")
        if vectorization not in VECTORIZATIONS:
            raise ValueError(
                f"vectorization must be one of {', '.join(VECTORIZATIONS)}, got {vectorization!r}"
            )
        probe = make_env(env_id, env_options)  # validates the id and options now
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.env_id, self.env_options = env_id, dict(env_options or {})
        self.num_envs, self.segment_length = num_envs, segment_length
        self.vectorization, self.heldout_size = vectorization, heldout_size

    def _item(self, kind: str, k: int) -> Item:
        return Item(
            id=f"{self.env_id}:{kind}-{k}",
            metadata={
                "env_id": self.env_id,
                "env_options": self.env_options,
                "num_envs": self.num_envs,
                "segment_length": self.segment_length,
                "vectorization": self.vectorization,
            },
        )

    def train_iter(self, seed: int) -> Iterator[Item]:
        return (self._item("segment", k) for k in itertools.count())

    def heldout(self, n: int | None = None) -> list[Item]:
        return [self._item("eval", k) for k in range(self.heldout_size if n is None else n)]

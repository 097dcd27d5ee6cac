"""A PettingZoo parallel environment small enough to check by hand.

Two agents, ``a`` (observation [t], 1 value) and ``b`` (observation [t, 10 + t]); each
step gives ``a`` its action + 1 and ``b`` 2 * (its action + 1). Every agent is
truncated at step ``limit``; ``a`` alone terminates at step ``end`` if set. ``raise_at``
and ``drop_at``: the step that raises, or whose observations lack ``b``; ``nan_at``:
the step whose reward for ``b`` is NaN."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Relay(ParallelEnv):
    metadata = {"name": "relay_v0"}

    def __init__(self, limit=3, end=None, raise_at=None, drop_at=None, nan_at=None, act_b=2):
        self.possible_agents = ["a", "b"]
        self.limit, self.end, self.raise_at, self.drop_at = limit, end, raise_at, drop_at
        self.nan_at, self.t = nan_at, 0
        self._obs = {
            "a": spaces.Box(0, 100, (1,), np.float32),
            "b": spaces.Box(0, 100, (2,), np.float32),
        }
        self._act = {"a": spaces.Discrete(2), "b": spaces.Discrete(act_b)}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def _observe(self):
        obs = {"a": np.array([self.t], np.float32), "b": np.array([self.t, 10 + self.t])}
        if self.t == self.drop_at:
            del obs["b"]
        return obs

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        if self.t == self.raise_at:
            raise RuntimeError("the simulator crashed")
        reward = {"a": float(actions["a"]) + 1, "b": 2.0 * (actions["b"] + 1)}
        if self.t == self.nan_at:
            reward["b"] = float("nan")
        term = {"a": self.t == self.end, "b": False}
        trunc = {a: self.t >= self.limit for a in self.agents}
        obs = self._observe()
        if any(term.values()) or any(trunc.values()):
            self.agents = []
        return obs, reward, term, trunc, {a: {} for a in self.possible_agents}


def relay(**options) -> Relay:
    return Relay(**options)

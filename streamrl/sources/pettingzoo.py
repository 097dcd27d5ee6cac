"""PettingZoo environments (parallel API) as a task source (``data.kind: pettingzoo``).

The Gymnasium side's multi-agent environments. An item asks for one segment, as a
``gym`` item does (``rollout.episode: gym``): ``segment_length`` steps of ``num_envs``
copies of the environment, every agent of every copy acting at each step. The copies'
agents are the columns of one vectorised environment (:class:`ParallelVectorEnv`), so
the policy acts for all of them in one call, and the episode hands the stream **one
segment per agent** (its columns, its rewards, the weight version of each step).

Policies:
    shared     one network for every agent (``agent_id: true`` appends a one-hot agent
               id to each observation, so the shared network can tell them apart)
    per_agent  one network per agent, in one module with one version: the observations
               end in the agent id, which chooses the network (model ``agents``)

Observations are flattened Boxes, zero-padded to the widest agent's; every agent has the
same action space. A copy's episode ends for all its agents when the first of them
ends: the others are truncated there (bootstrapped from their value) and the copy
resets in that step, as gymnasium's vector environments do.

Options:
    env_id:          a module with ``parallel_env`` (``mpe2.simple_spread_v3``) or
                     ``module:function`` returning a ParallelEnv
    env_options:     keyword arguments of that function (``{N: 2, max_cycles: 25}``)
    num_envs:        copies of the environment per rollout worker
    segment_length:  steps per segment
    policies:        "shared" | "per_agent"
    agent_id:        append the one-hot agent id to observations (always, per_agent)

>>> src = PettingZooTaskSource("mpe2.simple_spread_v3", {"N": 2}, num_envs=2, agent_id=True)
>>> src.agents, src.observation_space.shape, src.action_space
(['agent_0', 'agent_1'], (14,), Discrete(5))
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource
from streamrl.sources.environments import require

POLICIES = ("shared", "per_agent")
KIND = "pettingzoo"


def load_parallel_env(env_id: str, env_options: dict[str, Any] | None = None) -> Any:
    """A PettingZoo ParallelEnv: ``module`` (its ``parallel_env``) or ``module:function``,
    called with ``env_options``."""
    require("pettingzoo", KIND)
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"env_id={env_id!r}: {e} (PettingZoo's environments and mpe2 come with "
            "pip install 'streamrl[envs]')"
        ) from None
    factory = getattr(module, attr or "parallel_env", None)
    if not callable(factory):
        raise ValueError(f"env_id={env_id!r}: {module_name} has no {attr or 'parallel_env'}()")
    try:
        env = factory(**(env_options or {}))
    except TypeError as e:
        raise ValueError(f"env_options for {env_id!r}: {e}") from None
    if not hasattr(env, "possible_agents") or not hasattr(env, "step"):
        raise ValueError(f"env_id={env_id!r} did not build a PettingZoo ParallelEnv")
    return env


@dataclass(frozen=True)
class AgentLayout:
    """How the agents' observations become rows of one Box: flattened, zero-padded to
    the widest (``width``), then the one-hot agent id if ``agent_id``."""

    agents: list[str]
    width: int
    agent_id: bool
    observation_space: Any
    action_space: Any

    @classmethod
    def of(cls, env: Any, env_id: str, agent_id: bool) -> AgentLayout:
        from gymnasium import spaces

        agents = list(env.possible_agents)
        if not agents:
            raise ValueError(f"{env_id} has no agents")
        obs = [env.observation_space(a) for a in agents]
        acts = [env.action_space(a) for a in agents]
        for a, space in zip(agents, obs, strict=True):
            if not isinstance(space, spaces.Box):
                raise ValueError(f"{env_id}: agent {a}'s observations are {space}, not a Box")
        if any(act != acts[0] for act in acts):
            raise ValueError(
                f"{env_id}: the agents' action spaces differ ({', '.join(map(str, acts))}); "
                "one policy needs one action space"
            )
        width = max(int(np.prod(s.shape)) for s in obs)
        low, high = np.zeros((len(agents), width)), np.zeros((len(agents), width))
        for k, s in enumerate(obs):
            n = int(np.prod(s.shape))
            low[k, :n], high[k, :n] = s.low.reshape(-1), s.high.reshape(-1)
        k_id = len(agents) if agent_id else 0
        box = spaces.Box(
            np.concatenate([low.min(0), np.zeros(k_id)]).astype(np.float32),
            np.concatenate([high.max(0), np.ones(k_id)]).astype(np.float32),
            dtype=np.float32,
        )
        return cls(agents, width, agent_id, box, acts[0])

    def rows(self, obs: dict[str, Any], env_id: str) -> np.ndarray:
        """(K, width [+ K]) from one copy's observation dict; a missing agent or a wrong
        shape is a malformed observation (ValueError)."""
        out = np.zeros((len(self.agents), self.observation_space.shape[0]), dtype=np.float32)
        for k, a in enumerate(self.agents):
            if a not in obs:
                raise ValueError(f"{env_id}: no observation for agent {a}")
            x = np.asarray(obs[a], dtype=np.float32).reshape(-1)
            if x.size > self.width:
                raise ValueError(f"{env_id}: agent {a}'s observation has {x.size} values")
            out[k, : x.size] = x
            if self.agent_id:
                out[k, self.width + k] = 1.0
        return out


class ParallelVectorEnv:
    """``num_envs`` copies of a ParallelEnv as a gymnasium-style vector environment of
    ``num_envs * K`` columns, agent-major (column ``k * num_envs + i`` is agent k of copy
    i), with same-step autoreset and ``info["final_obs"]`` as gymnasium's."""

    def __init__(
        self, env_id: str, env_options: dict[str, Any] | None, num_envs: int, agent_id: bool
    ) -> None:
        self.env_id, self.copies = env_id, num_envs
        self.envs = [load_parallel_env(env_id, env_options) for _ in range(num_envs)]
        self.layout = AgentLayout.of(self.envs[0], env_id, agent_id)
        self.single_observation_space = self.layout.observation_space
        self.single_action_space = self.layout.action_space
        self.num_agents = len(self.layout.agents)
        self.num_envs = num_envs * self.num_agents

    def _reset(self, i: int, seed: int | None) -> np.ndarray:
        obs, _ = self.envs[i].reset(seed=seed)
        return self.layout.rows(obs, self.env_id)

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        rows = [self._reset(i, None if seed is None else seed + i) for i in range(self.copies)]
        return self._columns(np.stack(rows, axis=1)), {}

    def _columns(self, x: np.ndarray) -> np.ndarray:
        """(K, copies, ...) -> (K * copies, ...): agent-major columns."""
        return x.reshape(self.num_envs, *x.shape[2:])

    def _action(self, a: np.ndarray) -> Any:
        return int(a) if self.single_action_space.shape == () else np.asarray(a, np.float32)

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        k_n, n = self.num_agents, self.copies
        acts = np.asarray(actions).reshape(k_n, n, *np.shape(actions)[1:])
        obs = np.zeros((k_n, n, self.single_observation_space.shape[0]), np.float32)
        final = np.zeros_like(obs)
        reward = np.zeros((k_n, n), np.float32)
        term, trunc = np.zeros((k_n, n), bool), np.zeros((k_n, n), bool)
        for i, env in enumerate(self.envs):
            moves = {a: self._action(acts[k, i]) for k, a in enumerate(self.layout.agents)}
            o, r, te, tr, _ = env.step(moves)
            obs[:, i] = self.layout.rows(o, self.env_id)
            for k, a in enumerate(self.layout.agents):
                if a not in r:
                    raise ValueError(f"{self.env_id}: no reward for agent {a}")
                reward[k, i] = float(r[a])
                term[k, i] = bool(te.get(a, False))
            if term[:, i].any() or any(tr.get(a, False) for a in self.layout.agents):
                trunc[:, i] = ~term[:, i]  # the first to end ends the copy's episode
                final[:, i] = obs[:, i]
                obs[:, i] = self._reset(i, None)
        done = self._columns(term | trunc)
        info = {"final_obs": self._columns(final), "_final_obs": done}
        return (
            self._columns(obs),
            self._columns(reward),
            self._columns(term),
            self._columns(trunc),
            info,
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()


class PettingZooTaskSource(TaskSource):
    def __init__(
        self,
        env_id: str,
        env_options: dict[str, Any] | None = None,
        num_envs: int = 4,
        segment_length: int = 32,
        policies: Literal["shared", "per_agent"] = "shared",
        agent_id: bool = False,
        heldout_size: int = 10,
    ) -> None:
        if num_envs < 1 or segment_length < 1:
            raise ValueError("num_envs and segment_length must be >= 1")
        agent_id = agent_id or policies == "per_agent"  # the id chooses the network
        probe = load_parallel_env(env_id, env_options)  # validates the id and options now
        try:
            layout = AgentLayout.of(probe, env_id, agent_id)
        finally:
            probe.close()
        self.agents = layout.agents
        self.observation_space, self.action_space = (
            layout.observation_space,
            layout.action_space,
        )
        self.env_id, self.env_options = env_id, dict(env_options or {})
        self.num_envs, self.segment_length = num_envs, segment_length
        self.policies, self.agent_id, self.heldout_size = policies, agent_id, heldout_size

    def policy_options(self) -> dict[str, Any]:
        return {"agents": len(self.agents)} if self.policies == "per_agent" else {}

    def _item(self, kind: str, k: int) -> Item:
        return Item(
            id=f"{self.env_id}:{kind}-{k}",
            metadata={
                "env_id": self.env_id,
                "env_options": self.env_options,
                "num_envs": self.num_envs,
                "segment_length": self.segment_length,
                KIND: {"agents": list(self.agents), "agent_id": self.agent_id},
            },
        )

    def train_iter(self, seed: int) -> Iterator[Item]:
        return (self._item("segment", k) for k in itertools.count())

    def heldout(self, n: int | None = None) -> list[Item]:
        return [self._item("eval", k) for k in range(self.heldout_size if n is None else n)]

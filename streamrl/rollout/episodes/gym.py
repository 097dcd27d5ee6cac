"""The environment episode (``rollout.episode: gym``): fixed-length segments.

Each call plays ``segment_length`` steps of the worker's ``num_envs`` vectorised
environments with the policy engine and returns a :class:`~streamrl.core.types.Segment`
(observations, actions, behaviour log-probs, values, rewards, terminations,
truncations, bootstrap values, and the weight version of every step). The
environments persist between calls, so consecutive segments continue the same
episodes; calls of one worker run one at a time.

A PettingZoo environment's item (``data.kind: pettingzoo``) is played the same way, its
agents the columns of the vectorised environment; the episode returns one segment per
agent (:mod:`streamrl.rollout.episodes.multi_agent`).

An item of logged data (``data.kind: minari``) already carries its transitions
(``metadata["transitions"]``): the episode returns them as they are, so offline and
online experience share the stream.

Evaluation runs the same episode with ``greedy=True``: one whole episode with
deterministic actions on a fresh environment seeded by the item, its return in
``episode_returns`` (the trainer reports the mean over the held-out items).

An environment that raises or returns a non-finite observation or reward fails the
item with a clear message (counted, like a reward that raises); the environments are
rebuilt for the next segment, so an env failure never hangs or kills the run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from streamrl.core.transitions import Transitions
from streamrl.core.types import Item, Segment
from streamrl.engines.inference.policy import PolicyEngine
from streamrl.rollout.episodes.base import EpisodeSpec, Trajectories, register_episode
from streamrl.rollout.episodes.multi_agent import (
    evaluate_agents,
    evaluation_segment,
    split_agents,
)
from streamrl.sources.gym import make_env, make_vector_env
from streamrl.sources.pettingzoo import KIND as PETTINGZOO
from streamrl.sources.pettingzoo import ParallelVectorEnv


class EnvFailure(RuntimeError):
    """The environment raised or returned NaN/inf."""


def vector_env(meta: dict[str, Any]) -> Any:
    """The vectorised environment an item's metadata describes (a gym or a PettingZoo one)."""
    if PETTINGZOO in meta:
        return ParallelVectorEnv(
            meta["env_id"], meta["env_options"], meta["num_envs"], meta[PETTINGZOO]["agent_id"]
        )
    return make_vector_env(
        meta["env_id"], meta["num_envs"], meta["vectorization"], meta["env_options"]
    )


def _check_finite(name: str, x: np.ndarray, env_id: str) -> None:
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if bad.any():
        raise EnvFailure(
            f"{env_id} returned a non-finite {name} (environments {np.nonzero(bad)[0].tolist()})"
        )


@dataclass
class GymEpisode:
    seed: int = 0
    envs: Any = None
    obs: np.ndarray | None = None
    returns: np.ndarray | None = None  # running return of each environment's episode
    lengths: np.ndarray | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    segments: int = 0

    def _reset(self, meta: dict[str, Any], seed: int) -> None:
        if self.envs is not None:
            self.envs.close()
        self.envs = vector_env(meta)
        self.obs, _ = self.envs.reset(seed=seed)
        n = self.envs.num_envs
        self.returns, self.lengths = np.zeros(n), np.zeros(n, dtype=np.int64)

    def _actions(self, actions: np.ndarray) -> np.ndarray:
        space = self.envs.single_action_space
        if hasattr(space, "low"):  # a Box: the Gaussian is unbounded, the env is not
            return np.clip(actions, space.low, space.high)
        return actions

    async def __call__(
        self, engine: PolicyEngine, item: Item, seed: int, *, greedy: bool = False
    ) -> Segment | Transitions | Trajectories:
        if greedy:
            if PETTINGZOO in item.metadata:
                return evaluate_agents(engine, item)
            return self.evaluate(engine, item)
        if "transitions" in item.metadata:  # logged data (data.kind: minari): played already
            return item.metadata["transitions"]
        async with self.lock:
            meta = item.metadata
            if self.envs is None:
                self._reset(meta, seed)
            try:
                segment, columns = await self._segment(engine, meta)
            except BaseException:
                self.envs.close()
                self.envs = None  # rebuilt, from a new seed, for the next segment
                raise
        if PETTINGZOO in meta:  # one segment per agent
            return split_agents(segment, columns, meta[PETTINGZOO]["agents"])
        return segment

    async def _segment(
        self, engine: PolicyEngine, meta: dict[str, Any]
    ) -> tuple[Segment, list[int]]:
        """The segment, and the column (environment) of each episode that ended in it."""
        t_len, env_id = meta["segment_length"], meta["env_id"]
        obs, acts, logps, vals, rews, terms, truncs, finals, versions = ([] for _ in range(9))
        ended: list[tuple[int, float, int]] = []  # (column, return, length) of each episode
        for t in range(t_len):
            out = engine.act(self.obs)
            versions.append(engine.version)
            try:
                next_obs, reward, term, trunc, info = self.envs.step(self._actions(out["actions"]))
            except Exception as e:
                raise EnvFailure(f"{env_id}: step raised {type(e).__name__}: {e}") from e
            reward = np.asarray(reward, dtype=np.float32)
            _check_finite("observation", np.asarray(next_obs, dtype=np.float64), env_id)
            _check_finite("reward", reward, env_id)
            done = np.logical_or(term, trunc)
            final = np.zeros(len(done), dtype=np.float32)
            if np.any(trunc):  # bootstrap a cut episode from its final observation
                idx = np.nonzero(trunc)[0]
                final_obs = np.stack([info["final_obs"][i] for i in idx])
                final[idx] = engine.values(final_obs)
            self.returns += reward
            self.lengths += 1
            for i in np.nonzero(done)[0]:
                ended.append((int(i), float(self.returns[i]), int(self.lengths[i])))
                self.returns[i], self.lengths[i] = 0.0, 0
            obs.append(self.obs)
            acts.append(out["actions"])
            logps.append(out["logprobs"])
            vals.append(out["values"])
            rews.append(reward)
            terms.append(np.asarray(term, dtype=bool))
            truncs.append(np.asarray(trunc, dtype=bool))
            finals.append(final)
            self.obs = next_obs
            if t % 8 == 7:
                await asyncio.sleep(0)  # let the worker loop read commands
        self.segments += 1
        stack = lambda xs, dt=None: torch.as_tensor(np.stack(xs), dtype=dt)  # noqa: E731
        segment = Segment(
            obs=stack(obs, torch.float32),
            actions=stack(acts),
            logprobs=stack(logps, torch.float32),
            values=stack(vals, torch.float32),
            rewards=stack(rews, torch.float32),
            terminated=stack(terms, torch.bool),
            truncated=stack(truncs, torch.bool),
            final_values=stack(finals, torch.float32),
            last_obs=torch.as_tensor(np.asarray(self.obs), dtype=torch.float32),
            last_values=torch.as_tensor(engine.values(self.obs), dtype=torch.float32),
            versions=torch.tensor(versions, dtype=torch.long),
            episode_returns=[r for _, r, _ in ended],
            episode_lengths=[n for _, _, n in ended],
        )
        return segment, [c for c, _, _ in ended]

    def evaluate(self, engine: PolicyEngine, item: Item) -> Segment:
        """One whole episode with deterministic actions (no state shared with training)."""
        meta = item.metadata
        env = make_env(meta["env_id"], meta["env_options"])
        try:
            obs, _ = env.reset(seed=10_000 + max(item.index, 0))
            total, steps, done = 0.0, 0, False
            while not done:
                action = engine.act(np.asarray(obs)[None], greedy=True)["actions"][0]
                if hasattr(env.action_space, "low"):
                    action = np.clip(action, env.action_space.low, env.action_space.high)
                obs, reward, term, trunc, _ = env.step(action)
                total, steps, done = total + float(reward), steps + 1, bool(term or trunc)
        finally:
            env.close()
        return evaluation_segment(total, steps, engine.version, {"return": total})


@register_episode("gym")
def _gym(spec: EpisodeSpec, tokenizer: Any, reward: Any, sampling: Any) -> GymEpisode:
    return GymEpisode(seed=spec.seed)

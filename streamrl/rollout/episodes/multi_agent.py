"""A multi-agent environment's segment cut per agent, and its evaluation episode.

The gym episode plays a PettingZoo environment (``data.kind: pettingzoo``) as one
vectorised environment whose columns are (agent, copy) pairs, agent-major
(:class:`~streamrl.sources.pettingzoo.ParallelVectorEnv`). :func:`split_agents` gives
the stream one segment per agent: its columns, rewards and episodes, and the same
per-step weight versions (one policy acted for every agent at each step), so the
staleness bound and the stream's books hold per agent; the item stays one group.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from streamrl.core.types import Item, Segment
from streamrl.engines.inference.policy import PolicyEngine
from streamrl.rollout.episodes.base import Trajectories
from streamrl.sources.pettingzoo import KIND, ParallelVectorEnv

#: the fields of a segment with a column axis: (T, N, ...) per step, (N, ...) at its end
_STEP = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated")
_STEP += ("final_values",)
_LAST = ("last_obs", "last_values")


def split_agents(seg: Segment, columns: list[int], agents: list[str]) -> Trajectories:
    """``seg`` (T, K * n columns, agent-major) as K segments of n columns, one per agent;
    ``columns``: the column of each episode in ``seg.episode_returns``."""
    n = seg.rewards.shape[1] // len(agents)
    out = []
    for k, name in enumerate(agents):
        cols = slice(k * n, (k + 1) * n)
        mine = [j for j, c in enumerate(columns) if k * n <= c < (k + 1) * n]
        parts = {f: getattr(seg, f)[:, cols] for f in _STEP}
        parts |= {f: getattr(seg, f)[cols] for f in _LAST}
        rest = {
            f.name: getattr(seg, f.name)
            for f in fields(seg)
            if f.name not in parts and f.name not in ("episode_returns", "episode_lengths")
        }
        rest["versions"] = seg.versions.clone()
        rest["metadata"] = {**seg.metadata, "agent": name}
        out.append(
            Segment(
                **parts,
                **rest,
                episode_returns=[seg.episode_returns[j] for j in mine],
                episode_lengths=[seg.episode_lengths[j] for j in mine],
            )
        )
    return Trajectories(out)


def evaluate_agents(engine: PolicyEngine, item: Item) -> Segment:
    """One whole episode with deterministic actions for every agent, on a fresh copy
    seeded by the item; its return is the mean of the agents' returns (each agent's in
    ``reward_components``)."""
    meta = item.metadata
    env = ParallelVectorEnv(meta["env_id"], meta["env_options"], 1, meta[KIND]["agent_id"])
    agents = env.layout.agents
    try:
        obs, _ = env.reset(seed=10_000 + max(item.index, 0))
        returns, steps, done = np.zeros(len(agents)), 0, False
        while not done:
            actions = engine.act(obs, greedy=True)["actions"]
            obs, reward, term, trunc, _ = env.step(actions)
            returns, steps, done = returns + reward, steps + 1, bool((term | trunc).any())
    finally:
        env.close()
    total = float(returns.mean())
    per_agent = {f"return/{a}": float(r) for a, r in zip(agents, returns, strict=True)}
    return evaluation_segment(total, steps, engine.version, {"return": total, **per_agent})


def evaluation_segment(
    total: float, steps: int, version: int, components: dict[str, float]
) -> Segment:
    """An evaluation episode as a segment: its return and length, no transitions."""
    empty = torch.zeros(0)
    return Segment(
        obs=empty,
        actions=empty,
        logprobs=empty,
        values=empty,
        rewards=torch.tensor([total]),
        terminated=empty.bool(),
        truncated=empty.bool(),
        final_values=empty,
        last_obs=empty,
        last_values=empty,
        versions=torch.tensor([version]),
        episode_returns=[total],
        episode_lengths=[steps],
        metadata={"reward_components": components},
    )

"""Assembly: the whole config cut into what each component takes.

A component takes its own config section (``runtime`` for placement and backends,
``rollout`` for the sampling parameters); where one reads several sections it takes a
small typed spec declared in its own layer, holding exactly those. This module is the
one place that builds each spec from the whole :class:`~streamrl.config.Config`, so a
parameter's path runs one way: from the run, down to the component.
"""

from __future__ import annotations

from streamrl.config import Config, RunContext
from streamrl.engines.train.group import GroupSpec
from streamrl.models.policies import names_a_policy
from streamrl.rollout.episodes import EpisodeSpec
from streamrl.rollout.selection import SamplerContext
from streamrl.rollout.spec import RolloutSpec
from streamrl.stream.backends.placement import plan_placement


def episode_spec(cfg: Config) -> EpisodeSpec:
    """What an episode factory reads: ``rollout``, ``agent``, ``env`` and the seed."""
    return EpisodeSpec(rollout=cfg.rollout, agent=cfg.agent, env=cfg.env, seed=cfg.seed)


def rollout_spec(cfg: Config) -> RolloutSpec:
    """What a rollout worker (any process) and the endpoint's pool read."""
    return RolloutSpec(
        model=cfg.model,
        rollout=cfg.rollout,
        agent=cfg.agent,
        env=cfg.env,
        reward=cfg.reward,
        algorithm=cfg.algorithm,
        selection=cfg.selection,
        context=RunContext.of(cfg),
    )


def sampler_context(cfg: Config) -> SamplerContext:
    """What preflight's checks of the group sampler and the draw rule see."""
    return SamplerContext(
        selection=cfg.selection,
        rollout=cfg.rollout,
        algorithm=cfg.algorithm.name,
        policy=policy_run(cfg),
        endpoint=cfg.endpoint.enabled,
    )


def policy_run(cfg: Config) -> bool:
    """Whether the run trains an environment policy (a gym episode, or a policy preset or
    saved policy as the model), not a language model."""
    return cfg.rollout.episode == "gym" or names_a_policy(cfg.model.name_or_path)


def group_spec(cfg: Config, device: str = "cpu") -> GroupSpec:
    """The trainer's rank group (``train.world_size`` and its placement keys); each rank
    gets an equal share of the trainer's threads."""
    t = cfg.train
    threads = plan_placement(cfg.runtime).trainer_threads
    return GroupSpec(
        world_size=t.world_size,
        placement=t.placement,
        ray_strategy=t.ray_strategy,
        collective_timeout_s=t.collective_timeout_s,
        device=device,
        threads=max(1, threads // t.world_size),
    )

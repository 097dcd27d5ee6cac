"""Assembly: the whole config cut into what each component takes.

A component takes its own config section (``runtime`` for placement and backends,
``rollout`` for the sampling parameters); where one reads several sections it takes a
small typed spec declared in its own layer, holding exactly those. This module is the
one place that builds each spec from the whole :class:`~streamrl.config.Config`, so a
parameter's path runs one way: from the run, down to the component.
"""

from __future__ import annotations

from streamrl.config import Config, RunContext
from streamrl.models.policies import POLICY_PRESETS
from streamrl.rollout.episodes import EpisodeSpec
from streamrl.rollout.selection import SamplerContext
from streamrl.rollout.spec import RolloutSpec


def episode_spec(cfg: Config) -> EpisodeSpec:
    """What an episode factory reads: ``rollout``, ``agent`` and the seed."""
    return EpisodeSpec(cfg.rollout, cfg.agent, cfg.seed)


def rollout_spec(cfg: Config) -> RolloutSpec:
    """What a rollout worker (any process) and the endpoint's pool read."""
    return RolloutSpec(
        model=cfg.model,
        rollout=cfg.rollout,
        agent=cfg.agent,
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
        policy=cfg.rollout.episode == "gym" or cfg.model.name_or_path in POLICY_PRESETS,
        endpoint=cfg.endpoint.enabled,
    )

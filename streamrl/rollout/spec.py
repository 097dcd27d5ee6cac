"""What rolling out reads of the run's config, in one picklable value.

A rollout worker (in the trainer's process, a subprocess or a Ray actor) and the
endpoint's pool build their engine, episode, reward, algorithm and group sampler from
a :class:`RolloutSpec`: the config sections they read, and the few values of other
sections in the algorithm's :class:`~streamrl.config.RunContext`. The run builds it
from its whole config (``streamrl.run.assembly.rollout_spec``); nothing here sees the
whole config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrl.engines.factory import engine_options
from streamrl.rollout.episodes import EpisodeSpec

if TYPE_CHECKING:
    from streamrl.config import (
        AgentConfig,
        AlgorithmConfig,
        EnvConfig,
        ModelConfig,
        RewardConfig,
        RolloutConfig,
        RunContext,
        SelectionConfig,
    )


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """The sections a rollout worker and the endpoint's pool read, and the run's context
    (``streamrl.run.assembly.rollout_spec`` fills it; it pickles)."""

    model: ModelConfig
    """The weights' dtype of an engine built in another process; the served model's name."""
    rollout: RolloutConfig
    agent: AgentConfig
    env: EnvConfig
    reward: RewardConfig
    algorithm: AlgorithmConfig
    selection: SelectionConfig
    context: RunContext
    """The algorithm's view of other sections (the seed and η among them)."""

    @property
    def seed(self) -> int:
        return self.context.seed

    @property
    def episode(self) -> EpisodeSpec:
        return EpisodeSpec(
            rollout=self.rollout, agent=self.agent, env=self.env, seed=self.context.seed
        )

    @property
    def engine_options(self) -> dict[str, Any]:
        """The inference engine's settings (:func:`streamrl.engines.factory.engine_options`)."""
        return engine_options(self.rollout, self.context.max_staleness)

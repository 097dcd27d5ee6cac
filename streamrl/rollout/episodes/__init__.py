"""Episodes: how one item is rolled out and scored (training and evaluation alike)."""

from streamrl.rollout import envs as envs  # registers "env": text environments
from streamrl.rollout.episodes import agent as agent  # registers "agent"
from streamrl.rollout.episodes import gym as gym  # registers "gym"
from streamrl.rollout.episodes import single_turn as single_turn  # registers "single_turn"
from streamrl.rollout.episodes.base import (
    Episode,
    EpisodeSpec,
    PromptTooLong,
    Trajectories,
    build_episode,
    episode_kinds,
    episode_output,
    register_episode,
    sampling_params,
)
from streamrl.rollout.episodes.single_turn import SingleTurnEpisode, trajectory_from_result

__all__ = [
    "Episode",
    "EpisodeSpec",
    "PromptTooLong",
    "SingleTurnEpisode",
    "Trajectories",
    "build_episode",
    "episode_output",
    "episode_kinds",
    "register_episode",
    "sampling_params",
    "trajectory_from_result",
]

"""Text environments: the protocol (``base.py``), the environment episode that plays
them token in, token out (``episode.py``, ``rollout.episode: env``), scripted opponents
(``opponents.py``), the reward components that read an environment's return
(``rewards.py``), and one adapter per library: ``textarena.py``, ``verifiers.py``,
``openenv.py``. Their task sources (``data.kind``) are in :mod:`streamrl.sources`."""

from streamrl.rollout.envs import episode as episode  # registers rollout.episode "env"
from streamrl.rollout.envs import openenv as openenv  # registers env kind "openenv"
from streamrl.rollout.envs import rewards as rewards  # registers env_return, env_win
from streamrl.rollout.envs import textarena as textarena  # registers env kind "textarena"
from streamrl.rollout.envs import verifiers as verifiers  # registers env kind "verifiers"
from streamrl.rollout.envs import vf_arithmetic as vf_arithmetic  # arithmetic_teacher
from streamrl.rollout.envs.base import (
    Action,
    EnvError,
    Observation,
    Step,
    TextEnv,
    check_observation,
    check_step,
    guarded,
    in_thread,
)
from streamrl.rollout.envs.opponents import get_opponent, opponent_names, register_opponent
from streamrl.rollout.envs.registry import env_kinds, make_env, register_env

__all__ = [
    "Action",
    "EnvError",
    "Observation",
    "Step",
    "TextEnv",
    "check_observation",
    "check_step",
    "env_kinds",
    "get_opponent",
    "guarded",
    "in_thread",
    "make_env",
    "opponent_names",
    "register_env",
    "register_opponent",
]

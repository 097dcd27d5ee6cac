"""RL algorithms: pure tensor functions registered by name, and the Algorithm objects
that use them.

- ``advantages.py``: outcome-reward estimators, ``fn(rewards (N,), item_index (N,)) -> (N,)``.
- ``losses.py``: policy losses and ``RLLoss``, the ``loss_fn(outputs, batch)`` that
  ``TrainEngine.train_batch`` calls (every loss is a :class:`~streamrl.core.loss.LossFn`).
- ``base.py``: the ``Algorithm`` interface and ``build_algorithm(cfg.algorithm, run)``:
  an algorithm takes its own config section and a :class:`~streamrl.config.RunContext`.
- ``dpo.py``: preference losses (DPO, IPO) of the DPO stage; ``alol.py``: the A-LoL
  policy loss and its value baseline (offline stages).
- ``policy_gradient.py`` (GRPO & co.), ``remax.py``, ``actor_critic.py`` (PPO with a
  learned critic: ``ppo`` by GAE, ``appo`` by V-trace), ``distill.py`` (on-policy
  distillation: a teacher's per-token reverse KL): one file per algorithm;
  ``returns.py``: GAE, V-trace.
- ``turn_credit.py`` (per-turn advantages of multi-turn episodes: turn_discounted,
  gigpo) and ``role_conditioned.py`` (rae: a baseline per game and role, for self-play).
- ``offline.py`` (bc, iql, td3_bc on logged and online transitions) with its pure
  losses in ``offline_losses.py``.
- ``interleaved_sft.py``: demonstrations mixed into any policy-gradient algorithm's RL
  steps (``algorithm.interleaved_sft``), a wrapper ``build_algorithm`` applies.
- ``stages/``: the pre-RL stages (SFT, DPO, A-LoL) behind one ``Stage`` protocol.
"""

from streamrl.algorithms import actor_critic as actor_critic  # registers ppo, appo
from streamrl.algorithms import advantages as advantages
from streamrl.algorithms import alol as alol  # registers the alol policy loss
from streamrl.algorithms import distill as distill  # registers distill
from streamrl.algorithms import interleaved_sft as interleaved_sft  # wraps (share > 0)
from streamrl.algorithms import losses as losses
from streamrl.algorithms import offline as offline  # registers bc, iql, td3_bc
from streamrl.algorithms import role_conditioned as role_conditioned  # registers rae
from streamrl.algorithms import turn_credit as turn_credit  # turn_discounted, gigpo
from streamrl.algorithms.advantages import broadcast_to_tokens, group_stats, whiten
from streamrl.algorithms.base import (
    Algorithm,
    ExtraRollout,
    Filtered,
    algorithm_class,
    algorithm_names,
    build_algorithm,
    register_algorithm,
)
from streamrl.algorithms.losses import (
    AGG_MODES,
    PolicyLossFn,
    PolicyLossParams,
    RLLoss,
    SFTLoss,
    aggregate,
    kl_penalty,
    loss_weight,
    make_rl_loss_fn,
    sft_loss,
)
from streamrl.algorithms.policy_gradient import PolicyGradient, zero_variance
from streamrl.algorithms.registry import (
    AdvantageFn,
    UnknownNameError,
    advantage_names,
    get_advantage,
    get_policy_loss,
    policy_loss_names,
    register_advantage,
    register_policy_loss,
)
from streamrl.algorithms.remax import ReMax

__all__ = [
    "AGG_MODES",
    "AdvantageFn",
    "Algorithm",
    "ExtraRollout",
    "Filtered",
    "PolicyGradient",
    "PolicyLossFn",
    "PolicyLossParams",
    "RLLoss",
    "ReMax",
    "SFTLoss",
    "UnknownNameError",
    "advantage_names",
    "aggregate",
    "algorithm_class",
    "algorithm_names",
    "broadcast_to_tokens",
    "build_algorithm",
    "get_advantage",
    "get_policy_loss",
    "group_stats",
    "kl_penalty",
    "loss_weight",
    "make_rl_loss_fn",
    "policy_loss_names",
    "register_advantage",
    "register_algorithm",
    "register_policy_loss",
    "sft_loss",
    "whiten",
    "zero_variance",
]

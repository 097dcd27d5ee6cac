"""RL algorithms as pure tensor functions, registered by name.

Advantages: ``get_advantage(name)(rewards (N,), group_ids (N,)) -> (N,)``.
Losses: ``make_rl_loss_fn(policy_loss_name, PolicyLossParams(...))`` gives the
``loss_fn(outputs, batch)`` that ``TrainEngine.train_batch`` calls.
"""

from streamrl.algorithms import advantages as advantages
from streamrl.algorithms import losses as losses
from streamrl.algorithms.advantages import broadcast_to_tokens, group_stats, whiten
from streamrl.algorithms.losses import (
    AGG_MODES,
    PolicyLossFn,
    PolicyLossParams,
    RLLoss,
    aggregate,
    kl_penalty,
    loss_weight,
    make_rl_loss_fn,
    sft_loss,
)
from streamrl.algorithms.registry import (
    UnknownNameError,
    advantage_names,
    get_advantage,
    get_policy_loss,
    policy_loss_names,
    register_advantage,
    register_policy_loss,
)

__all__ = [
    "AGG_MODES",
    "PolicyLossFn",
    "PolicyLossParams",
    "RLLoss",
    "UnknownNameError",
    "advantage_names",
    "aggregate",
    "broadcast_to_tokens",
    "get_advantage",
    "get_policy_loss",
    "group_stats",
    "kl_penalty",
    "loss_weight",
    "make_rl_loss_fn",
    "policy_loss_names",
    "register_advantage",
    "register_policy_loss",
    "sft_loss",
    "whiten",
]

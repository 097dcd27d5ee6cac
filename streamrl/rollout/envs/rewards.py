"""Reward components that read what the environment gave a seat.

The environment episode scores each seat's trajectory with the run's reward
components (``reward.components``), like any answer, after writing the seat's result
into its item's ``metadata["env_result"]``: ``return`` (the sum of the rewards the
environment gave the seat). Shaping components (a format reward) can be added beside
these; the trajectory's reward is the weighted total.

>>> from streamrl.core.types import Item
>>> item = Item(id="game", metadata={ENV_RESULT: {"return": 1.0}})
>>> env_return("[bet]", item), env_win("[bet]", item)
(1.0, 1.0)
"""

from __future__ import annotations

from streamrl.core.types import Item
from streamrl.rollout.rewards import register_reward

ENV_RESULT = "env_result"  # item.metadata key: the seat's result from the environment


def _result(item: Item) -> dict:
    if ENV_RESULT not in item.metadata:
        raise ValueError(
            "env_return and env_win score environment episodes (rollout.episode: env): "
            f"item {item.id!r} has no environment result"
        )
    return item.metadata[ENV_RESULT]


@register_reward("env_return")
def env_return(completion: str, item: Item) -> float:
    """The seat's return: the sum of the rewards the environment gave it."""
    return float(_result(item)["return"])


@register_reward("env_win")
def env_win(completion: str, item: Item) -> float:
    """1 when the seat's return is positive (a game won), else 0 (lost or drawn)."""
    return 1.0 if float(_result(item)["return"]) > 0 else 0.0

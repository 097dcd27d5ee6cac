"""Name -> function registries for advantage estimators and policy losses.

Configs name an algorithm by string; the trainer looks the function up here once and
never branches on the name itself::

    @register_advantage("my_adv")
    def my_adv(rewards, item_index, *, eps=1e-6): ...

    get_advantage("my_adv")  # -> my_adv; an unknown name lists the known ones
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

F = TypeVar("F", bound=Callable)


class AdvantageFn(Protocol):
    """A registered outcome-reward estimator (see ``advantages.py``)."""

    group_relative: bool
    """It compares the samples of one item with each other (needs group_size >= 2)."""

    def __call__(
        self, rewards: torch.Tensor, item_index: torch.Tensor, *, eps: float = 1e-6
    ) -> torch.Tensor: ...


_ADVANTAGES: dict[str, Callable] = {}
_POLICY_LOSSES: dict[str, Callable] = {}


class UnknownNameError(KeyError, ValueError):
    """Unknown registry name. Catchable as KeyError or ValueError; prints unquoted."""

    def __str__(self) -> str:
        return str(self.args[0])


def _register(table: dict[str, Callable], kind: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        if name in table and table[name] is not fn:
            raise ValueError(
                f"{kind} {name!r} is already registered (by {table[name].__qualname__})"
            )
        table[name] = fn
        return fn

    return decorator


def _get(table: dict[str, Callable], kind: str, name: str) -> Callable:
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "<none>"
        raise UnknownNameError(f"unknown {kind} {name!r}; known: {known}") from None


def register_advantage(
    name: str, *, group_relative: bool = False, needs: tuple[str, ...] = ()
) -> Callable[[F], F]:
    """Register ``fn(rewards (N,), item_index (N,), *, eps=1e-6) -> (N,)``.

    ``group_relative``: the estimator compares the samples of one item with each
    other, so it needs ``rollout.group_size >= 2`` (with one sample it is always 0).
    ``needs``: the keyword inputs it takes beyond the rewards and the groups (per-turn
    rewards, roles, ...), which its algorithm supplies; such an estimator may return
    more than one advantage per sample (one per turn) as its algorithm documents.
    """

    def decorator(fn: F) -> F:
        fn.group_relative = group_relative  # type: ignore[attr-defined]
        fn.needs = needs  # type: ignore[attr-defined]
        return _register(_ADVANTAGES, "advantage", name)(fn)

    return decorator


def register_policy_loss(name: str, *, agg_mode: str | None = None) -> Callable[[F], F]:
    """Register a policy loss (see ``losses.PolicyLossFn`` for the signature).

    ``agg_mode`` pins the aggregation a loss is defined with (GSPO is sequence-level);
    ``make_rl_loss_fn`` then uses it for every term instead of ``params.agg_mode``.
    """

    def decorator(fn: F) -> F:
        fn.agg_mode = agg_mode  # type: ignore[attr-defined]
        return _register(_POLICY_LOSSES, "policy loss", name)(fn)

    return decorator


def get_advantage(name: str) -> AdvantageFn:
    return _get(_ADVANTAGES, "advantage", name)  # type: ignore[return-value]


def get_policy_loss(name: str) -> Callable:
    return _get(_POLICY_LOSSES, "policy loss", name)


def advantage_names() -> list[str]:
    return sorted(_ADVANTAGES)


def policy_loss_names() -> list[str]:
    return sorted(_POLICY_LOSSES)

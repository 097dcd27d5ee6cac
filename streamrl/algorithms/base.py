"""The ``Algorithm`` object: everything algorithm-specific, in one place.

The controller never asks which algorithm runs. It builds one object from the
``algorithm`` section (and the few values of other sections it needs, named in a
:class:`~streamrl.config.RunContext`) and calls, in this order::

    algo = build_algorithm(cfg.algorithm, RunContext.of(cfg))   # also in every rollout worker
    algo.setup(trainer, tokenizer)           # extra models: a frozen reference, a critic
    batch = algo.prepare(groups, trainer, timer)   # advantages, extra forwards
    trainer.train_batch(batch, algo.loss_fn, num_minibatches=...)

Rollout side (inside each rollout worker, with no trainer and no extra models):
``extra_rollouts`` asks the worker for rollouts beyond the group's samples (ReMax's
greedy baseline), and ``finish_group`` turns a scored group into the trajectories
to train on, or into a filter reason (dynamic sampling).

Checkpoints hold ``state_dict()``: the extra models' weights and any state the
algorithm keeps between steps.

``algorithm.name`` names the algorithm. Outcome-reward estimators that need only
rewards are pure functions (``register_advantage``) served by :class:`PolicyGradient`.
An algorithm that needs more (a greedy baseline, a learned critic) registers an
Algorithm class under its name with :func:`register_algorithm`; see ``remax.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from streamrl.algorithms.registry import UnknownNameError, advantage_names
from streamrl.config import AlgorithmConfig, RunContext
from streamrl.core.loss import LossFn
from streamrl.core.sample import Sample

if TYPE_CHECKING:
    from streamrl.core.messages import DroppedGroup
    from streamrl.stream.sample_stream import Group


class Timer(Protocol):
    """``with timer("name"):`` adds the block's seconds to metric ``time/name``."""

    def __call__(self, name: str) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class ExtraRollout:
    """A rollout of the group's item that the algorithm needs beyond the samples.

    It is never trained on; ``finish_group`` receives it under ``name``."""

    name: str
    greedy: bool = True


@dataclass(frozen=True)
class Filtered:
    """``finish_group``'s verdict that a group carries no training signal."""

    reason: str


EQUAL_REWARDS = "zero_reward_std"  # dynamic sampling's reason: every sample scored the same


class Algorithm:
    """Base class. Subclasses override what they need; see the module docstring."""

    #: rollouts each item needs beyond ``rollout.group_size`` samples
    extra_rollouts: ClassVar[tuple[ExtraRollout, ...]] = ()
    #: whether the groups ``finish_group`` drops come back to ``observe_dropped``
    wants_dropped: ClassVar[bool] = False

    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        self.cfg, self.run = cfg, run

    # ------------------------------------------------------------ rollout side

    def finish_group(
        self, samples: list[Sample], extras: dict[str, Sample]
    ) -> list[Sample] | Filtered:
        """The samples to train on, or why the group is dropped."""
        return samples

    # ------------------------------------------------------------ trainer side

    def observe_dropped(self, groups: list[DroppedGroup]) -> None:
        """The groups dropped since the last batch, by item index, before ``prepare``
        (only where ``wants_dropped``)."""

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        """Build the models the algorithm owns beyond the policy (after SFT)."""

    def prepare(self, groups: list[Group], trainer: Any, timer: Timer) -> Any:
        """A training batch with everything ``loss_fn`` reads."""
        raise NotImplementedError

    @property
    def loss_fn(self) -> LossFn:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Extra models and state, for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (after :meth:`setup`)."""


A = TypeVar("A", bound=type[Algorithm])
_ALGORITHMS: dict[str, type[Algorithm]] = {}
DEFAULT = "policy_gradient"


def register_algorithm(name: str) -> Callable[[A], A]:
    """Class decorator: ``algorithm.name: <name>`` builds this class."""

    def decorator(cls: A) -> A:
        if name in _ALGORITHMS and _ALGORITHMS[name] is not cls:
            raise ValueError(f"algorithm {name!r} is already registered")
        _ALGORITHMS[name] = cls
        return cls

    return decorator


def algorithm_names() -> list[str]:
    """Every name ``algorithm.name`` takes: the registered algorithms and estimators."""
    return sorted(set(advantage_names()) | set(_ALGORITHMS) - {DEFAULT})


def algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class that serves ``algorithm.name``; unknown names fail here."""
    if name in _ALGORITHMS:
        return _ALGORITHMS[name]
    if name not in advantage_names():
        raise UnknownNameError(
            f"algorithm.name: unknown algorithm {name!r}; known: {', '.join(algorithm_names())}"
        )
    return _ALGORITHMS[DEFAULT]


_WRAPPERS: list[Callable[[Algorithm], Algorithm]] = []


def register_wrapper(wrap: Callable[[Algorithm], Algorithm]) -> Callable[[Algorithm], Algorithm]:
    """``wrap(algorithm)`` -> the algorithm, or one wrapping it (a mechanism that works with
    any algorithm, switched on by its own key of the section: interleaved SFT)."""
    _WRAPPERS.append(wrap)
    return wrap


def build_algorithm(cfg: AlgorithmConfig, run: RunContext) -> Algorithm:
    """The run's algorithm object from its section and the run around it (validates:
    names, group sizes, ...), wrapped by every registered wrapper."""
    algo = algorithm_class(cfg.name)(cfg, run)
    for wrap in _WRAPPERS:
        algo = wrap(algo)
    return algo


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's padding id (0 without one, or without a tokenizer)."""
    pad = getattr(tokenizer, "pad_token_id", None)  # (a Hugging Face tokenizer's)
    return pad if pad is not None else 0

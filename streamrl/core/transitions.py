"""Flat transitions: what offline (logged) data carries, and what TD algorithms train on.

A logged item from an offline dataset (:mod:`streamrl.sources.minari`) carries a
:class:`Transitions` in ``item.metadata["transitions"]``; the gym episode returns it
unchanged, so it goes through the same stream as the segments online rollouts play.
:func:`segment_transitions` turns an online :class:`~streamrl.core.types.Segment` into the
same form, so an algorithm sees one kind of batch whatever the mix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from streamrl.core.types import Segment


@dataclass
class Transitions:
    """M transitions (s, a, r, s', terminated), logged or played.

    obs, next_obs:  (M, *obs_shape) float32
    actions:        (M,) long (discrete) or (M, act_dim) float32 (continuous)
    rewards:        (M,) float32
    terminated:     (M,) bool: s' is terminal (no bootstrap from it)
    versions:       (M,) long: the weight version that chose each action; -1 for logged
                    data (no version of this run's policy chose it)

    A :class:`~streamrl.core.sample.Sample` of environment steps: ``num_generated``
    counts the actions chosen by this run's policy (0 for logged data, so its staleness
    is counted from the version its item was admitted at).
    """

    environment: ClassVar[bool] = True

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    versions: torch.Tensor
    item_index: int = -1
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])

    @property
    def logged(self) -> bool:
        return bool((self.versions < 0).all())

    @property
    def reward(self) -> float:
        return float(self.rewards.mean()) if self.size else 0.0

    @property
    def num_generated(self) -> int:
        return int((self.versions >= 0).sum())

    @property
    def min_version(self) -> int:
        played = self.versions[self.versions >= 0]
        return int(played.min()) if played.numel() else -1

    def step_rewards(self) -> tuple[int, float]:
        return self.size, float(self.rewards.sum())

    def transitions(self) -> Transitions:
        return self

    def rows(self, index: torch.Tensor) -> Transitions:
        return Transitions(**{name: getattr(self, name)[index] for name in TENSORS})


#: the per-transition tensors (what ``rows`` selects and ``concat`` joins)
TENSORS = ("obs", "actions", "rewards", "next_obs", "terminated", "versions")


def concat(parts: list[Transitions]) -> Transitions:
    """One :class:`Transitions` of all ``parts``, in order."""
    return Transitions(**{name: torch.cat([getattr(p, name) for p in parts]) for name in TENSORS})


def segment_transitions(seg: Segment) -> Transitions:
    """The transitions of a segment (T steps x N environments), time-major.

    s'[t] is obs[t + 1] (or ``last_obs`` after the last step). Where an episode ended,
    the environment reset in the same step, so obs[t + 1] is the next episode's first
    observation: a terminated step keeps it as a placeholder (its target does not
    bootstrap), and a truncated step, whose final observation the segment does not
    keep, is left out (it would bootstrap from the wrong state).

    >>> from streamrl.core.types import Segment
    >>> seg = Segment(
    ...     obs=torch.arange(6.0).reshape(3, 1, 2), actions=torch.zeros(3, 1, dtype=torch.long),
    ...     logprobs=torch.zeros(3, 1), values=torch.zeros(3, 1), rewards=torch.ones(3, 1),
    ...     terminated=torch.tensor([[False], [True], [False]]),
    ...     truncated=torch.tensor([[False], [False], [True]]), final_values=torch.zeros(3, 1),
    ...     last_obs=torch.full((1, 2), 9.0), last_values=torch.zeros(1),
    ...     versions=torch.tensor([4, 4, 5]))
    >>> tr = segment_transitions(seg)
    >>> tr.size, tr.next_obs[0].tolist(), tr.terminated.tolist(), tr.versions.tolist()
    (2, [2.0, 3.0], [False, True], [4, 4])
    """
    t_len, n = seg.rewards.shape
    next_obs = torch.cat([seg.obs[1:], seg.last_obs[None]], dim=0)
    keep = ~seg.truncated.reshape(-1)
    flat = lambda x: x.reshape(t_len * n, *x.shape[2:])[keep]  # noqa: E731
    return Transitions(
        obs=flat(seg.obs),
        actions=flat(seg.actions),
        rewards=flat(seg.rewards),
        next_obs=flat(next_obs),
        terminated=flat(seg.terminated),
        versions=flat(seg.versions[:, None].expand(t_len, n)),
        item_index=seg.item_index,
        episode_returns=list(seg.episode_returns),
        episode_lengths=list(seg.episode_lengths),
    )

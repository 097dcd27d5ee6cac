"""``Sample``: what every kind of sample gives the rest of streamrl.

A sample is one rollout of an item, as the stream carries it: a language model's
:class:`~streamrl.core.types.Trajectory`, an environment
:class:`~streamrl.core.types.Segment`, or :class:`~streamrl.core.transitions.Transitions`
(logged data, or steps turned into transitions). The stream and the pool read its
reward, item and versions (staleness); the step metrics, evaluation and the algorithms
read the rest of this protocol, never the concrete type. A new kind of sample
implements these members and flows through unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from streamrl.core.transitions import Transitions


@runtime_checkable
class Sample(Protocol):
    environment: ClassVar[bool]
    """Its actions are environment steps (a Segment, Transitions) rather than a language
    model's tokens (a Trajectory): what its ``num_generated`` counts, and whether its
    score is an episode return or a graded answer."""

    item_index: int
    """The issue index of the item it answers; the samples of one item form a group."""

    metadata: dict[str, Any]
    """Reward components, decoded text, finish reason, selection weights, ..."""

    episode_returns: list[float]
    """Returns of the environment episodes that ended in it (none for a trajectory)."""

    episode_lengths: list[int]
    """Lengths of those episodes, in steps."""

    @property
    def reward(self) -> float:
        """A trajectory's score; the mean reward per step of environment samples."""
        ...

    @property
    def min_version(self) -> int:
        """The oldest weight version among the actions this run's policy chose (-1: none);
        what staleness is counted from."""
        ...

    @property
    def num_generated(self) -> int:
        """Actions this run's policy chose: generated tokens, environment steps (0 for
        logged data, whose staleness counts from the version its item was admitted at)."""
        ...

    @property
    def logged(self) -> bool:
        """Logged data: no action in it was chosen by this run's policy."""
        ...

    def step_rewards(self) -> tuple[int, float]:
        """(steps, summed reward) of its environment steps; a trajectory is one step
        with its reward."""
        ...

    def transitions(self) -> Transitions:
        """Its steps as flat (s, a, r, s') transitions (environment samples only; a
        trajectory raises TypeError)."""
        ...

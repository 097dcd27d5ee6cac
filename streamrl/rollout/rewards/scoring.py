"""Score a group with the group rewards once its samples are in (the rollout worker's step).

Each episode scored its own answer by the per-answer components (``metadata
["reward_components"]``, ``["reward_errors"]`` and the trajectory's ``reward``); this adds
the group components' values to each: the same keys, the weighted sum added to
``reward``, a component's details (:class:`~streamrl.rollout.rewards.group.Scores`) under
``metadata["reward_details"]``, a failure recorded as the answer's reward error (the worker then counts the
group as failed, ``reward_error:<name>``, as it does for a per-answer failure).
"""

from __future__ import annotations

from collections.abc import Sequence

from streamrl.core.types import Item, Trajectory
from streamrl.rollout.rewards.group import Completions
from streamrl.rollout.rewards.registry import CompositeReward


def group_completions(trajectories: Sequence[Trajectory]) -> Completions:
    """The answers' texts (``metadata["completion"]``, what the episode scored) and the
    tokens each generated."""
    return Completions(
        [t.metadata.get("completion", "") for t in trajectories],
        [t.num_generated for t in trajectories],
    )


async def add_group_rewards(
    reward: CompositeReward | None, item: Item, trajectories: Sequence[Trajectory]
) -> None:
    """Score ``trajectories`` (one item's group, in order) by ``reward``'s group
    components, in place; nothing to do without one."""
    if reward is None or not trajectories or not reward.applicable_group(item):
        return
    results = await reward.ascore_group(group_completions(trajectories), item)
    for t, r in zip(trajectories, results, strict=True):
        t.metadata.setdefault("reward_components", {}).update(r.components)
        if r.details:  # e.g. a rubric's per-criterion scores
            t.metadata.setdefault("reward_details", {}).update(r.details)
        if r.errors:
            t.metadata["reward_errors"] = {**(t.metadata.get("reward_errors") or {}), **r.errors}
        if r.total is not None:
            t.reward = float(t.reward) + r.total

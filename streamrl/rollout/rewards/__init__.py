"""Reward functions (plain ``fn(completion, item) -> float``, or over a whole group
``fn(completions, item) -> list[float]``), their registry and guard.

``CompositeReward([("numeric_match", 1.0), ("format_reward", 0.1)], timeout_s=5)``
scores a completion into a :class:`RewardResult` (total, per-component values,
errors); a component that raises or hangs is a recorded failure (see ``guard``).

Beyond rule-based checks, two built-ins score with a model: ``reward_model`` (a
sequence-classification model, concurrent calls batched into one forward pass; see
:mod:`streamrl.rollout.rewards.reward_model`) and ``llm_judge`` (a judge model through the
inference engine, its output parsed into a score; see :mod:`streamrl.rollout.rewards.llm_judge`).
Use them by name (``get_reward("reward_model", path=...)``, ``reward.components``); the
submodules keep those names, so the functions are not re-exported here.

Group rewards (:mod:`streamrl.rollout.rewards.group`: ``majority_vote``,
``overlong_penalty``, ``length_aware``) are components too; the rollout worker scores a
group with them once its samples are in (:mod:`streamrl.rollout.rewards.scoring`). The
judged ones (``pairwise_judge``, ``tournament_judge``, ``rubric_judge``) ask a judge through
one backend interface, a URL, a frozen model or the policy
(:mod:`streamrl.rollout.rewards.judges`).
"""

from streamrl.rollout.rewards.functions import (
    ANSWER_TAG_PATTERN,
    INTEGER_PATTERN,
    exact_match,
    extract_answer,
    format_reward,
    last_number,
    math_verify,
    numeric_match,
    reasoning_gym,
)
from streamrl.rollout.rewards.group import Completions, majority_vote
from streamrl.rollout.rewards.guard import GuardError, Outcome, RewardGuard, Scored, describe_error
from streamrl.rollout.rewards.llm_judge import load_judge, parse_judgement
from streamrl.rollout.rewards.registry import (
    CompositeReward,
    RewardFn,
    RewardResult,
    build_group_reward,
    build_reward,
    get_reward,
    is_group,
    register_reward,
    reward_names,
    reward_options,
)
from streamrl.rollout.rewards.reward_model import MicroBatcher, load_reward_model

__all__ = [
    "ANSWER_TAG_PATTERN",
    "INTEGER_PATTERN",
    "Completions",
    "CompositeReward",
    "GuardError",
    "MicroBatcher",
    "Outcome",
    "RewardFn",
    "RewardGuard",
    "RewardResult",
    "Scored",
    "build_group_reward",
    "build_reward",
    "describe_error",
    "exact_match",
    "extract_answer",
    "format_reward",
    "get_reward",
    "is_group",
    "last_number",
    "load_judge",
    "load_reward_model",
    "majority_vote",
    "math_verify",
    "numeric_match",
    "parse_judgement",
    "reasoning_gym",
    "register_reward",
    "reward_names",
    "reward_options",
]

"""Config of the curriculum sampler (``selection.kind: curriculum``): the difficulty
curriculum and the bandit over tasks (``selection.curriculum.*``), and per-prompt rollout
budgets (``selection.budgets.*``); the sampler is
:mod:`streamrl.rollout.selection.curriculum`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.config.base import Section


class CurriculumConfig(Section):
    """Move each task's difficulty level with the policy's measured success rate, and
    (a mixture) choose the next task by a bandit over its domains."""

    band: list[float] = Field(
        default_factory=lambda: [0.2, 0.8],
        min_length=2,
        max_length=2,
        description="Target success rate [low, high] of a task's samples at its current level: "
        "above high the level goes up, below low it goes down. [0, 1]: the level never moves.",
    )
    min_groups: int = Field(
        8,
        ge=1,
        description="Groups of a task's current level (ended since its last move) before the "
        "level may move again.",
    )
    backoff: float = Field(
        2.0,
        ge=1,
        description="Hysteresis: each move that reverses the last one multiplies the evidence "
        "the next move needs (min_groups) by this, up to max_backoff; a move in the same "
        "direction resets it.",
    )
    max_backoff: float = Field(16.0, ge=1, description="The most backoff multiplies min_groups by.")
    start_level: int = Field(
        0,
        description="Level every task starts at: 0 the easiest; -1 the hardest (the task as "
        "configured for arithmetic), -2 one below, ...; clipped to the task's levels.",
    )
    success_threshold: float = Field(
        0.5, description="A sample counts as a success when its reward is above this."
    )
    stall_groups: int = Field(
        16,
        ge=0,
        description="Groups dropped for equal rewards in a row (no usable group between) "
        "after which the outcomes reported so far are taken in at once instead of at the "
        "trainer's next weight publish, which never comes while every group is dropped: a "
        "level where nothing is learned can then be left. Timing decides which outcomes "
        "that includes, so an eta=0 run that gets there is no longer bit-exact. 0: never.",
    )
    bandit: Literal["none", "boltzmann"] = Field(
        "none",
        description="'boltzmann' (a mixture): draw each item's task with probability "
        "proportional to weight * exp(Q / temperature), Q each task's smoothed reward "
        "(selection.curriculum.bandit_reward), as SEC does; 'none': by the mixture's weights.",
    )
    bandit_reward: Literal["advantage", "progress"] = Field(
        "advantage",
        description="What a task's group earns its arm: 'advantage', the mean |reward - group "
        "mean| of its samples (0 for an all-equal group, most at a success rate of 1/2); "
        "'progress', |fast - slow moving average| of the task's success rate (learning "
        "progress, either way).",
    )
    temperature: float = Field(0.1, gt=0, description="Boltzmann temperature of the bandit.")
    learning_rate: float = Field(
        0.2, gt=0, le=1, description="Q <- (1 - lr) Q + lr * reward, per group, in item order."
    )
    exploration: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of draws by the mixture's weights alone, so no task starves.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> CurriculumConfig:
        low, high = self.band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(
                f"band must be [low, high] with 0 <= low <= high <= 1, got {self.band}"
            )
        return self


class BudgetsConfig(Section):
    """Per-prompt rollout budgets (DARS-style): more samples for prompts near the success
    boundary, fewer for solved or hopeless ones, the same on average as rollout.group_size."""

    enabled: bool = Field(False, description="Give each item its own number of samples.")
    min_samples: int = Field(2, ge=2, description="The fewest samples an item gets.")
    max_samples: int = Field(16, ge=2, description="The most samples an item gets.")
    prior_strength: float = Field(
        4.0,
        gt=0,
        description="A prompt never seen takes its task level's success rate r as a Beta(k r, "
        "k (1 - r)) prior with k = this; its own groups add to it.",
    )
    smoothing: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Moving average rate of the mean boundary weight the budgets are scaled "
        "by (so their mean stays rollout.group_size).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BudgetsConfig:
        if self.min_samples > self.max_samples:
            raise ValueError(
                f"min_samples={self.min_samples} must be <= max_samples={self.max_samples}"
            )
        return self

"""The ``eval`` config section: held-out evaluation."""

from __future__ import annotations

from pydantic import Field

from streamrl.config.base import Section


class EvalConfig(Section):
    heldout_size: int = Field(500, ge=1, description="Held-out items for greedy evaluation.")
    every: int = Field(50, ge=0, description="Evaluate every N RL steps (0 = only before/after).")
    samples: int = Field(
        4,
        ge=0,
        description="Also sample N completions per held-out item at rollout.temperature and "
        "report their mean accuracy as eval/sampled_accuracy: the policy's own reliability, "
        "which RL optimises (0 = greedy only). Language tasks only: environments are "
        "evaluated by deterministic episodes.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="Evaluation answer budget. Default: rollout.max_new_tokens "
        "(an item's metadata.max_new_tokens still overrides either).",
    )

"""Config section of difficulty-aware prompt selection (``selection.*``), assembled into
``Config`` by :mod:`streamrl.config.schema`; the selector itself is :mod:`streamrl.rollout.selection.posterior`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.config.base import Section
from streamrl.config.curriculum import BudgetsConfig, CurriculumConfig
from streamrl.config.hints import HintsConfig


class SelectionConfig(Section):
    """Skip prompts whose next group is predicted to be all-equal (MoPPS/VADE-style): a
    Beta-Bernoulli posterior over each prompt's success rate, keyed by the item id, or the
    policy's own probability of the reference answer."""

    kind: str = Field(
        "none",
        description="Registered group sampler (a plugin may add one). "
        "'none': issue every drawn item; 'posterior': skip (never issue) an item "
        "when its posterior P(all group_size outcomes equal) exceeds selection.threshold; "
        "'likelihood': before generating a group, score the reference answer under the current "
        "policy (p) and skip the item when p^G, a lower bound on P(all G correct), exceeds "
        "selection.threshold; counted as selection/skipped/predicted_all_correct (and see "
        "selection.skip_all_wrong and selection.max_candidates); 'curriculum': move each task's "
        "difficulty level with its success rate, a bandit over a mixture's tasks, and "
        "per-prompt rollout budgets (selection.curriculum.*, selection.budgets.*).",
    )
    prior_alpha: float = Field(
        1.0, gt=0, description="Beta prior's alpha (pseudo-successes) of every prompt."
    )
    prior_beta: float = Field(
        1.0, gt=0, description="Beta prior's beta (pseudo-failures) of every prompt."
    )
    threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="posterior: skip when P(all equal) = E[p^G + (1-p)^G] under the posterior "
        "is above this; must exceed the prior's own value (2/(G+1) for Beta(1,1)), so fresh "
        "prompts run. likelihood: skip when the policy's p^G is above this.",
    )
    decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Evidence k trainer steps old weighs decay^k (the policy improves): a "
        "skipped prompt drifts back to the prior and is tried again; 1 = never forget.",
    )
    skip_all_wrong: bool = Field(
        False,
        description="likelihood: also skip an item when (1-p)^G exceeds selection.threshold "
        "(counted as selection/skipped/predicted_all_wrong). p is a lower bound on the success "
        "rate, so (1-p)^G over-states P(all G wrong): use it only where the reference is the "
        "one accepted form of the answer (exact-match tasks taught by SFT).",
    )
    acceptance: Literal["skip", "importance"] = Field(
        "skip",
        description="likelihood: 'skip' every item whose predicted P(all equal) q exceeds "
        "selection.threshold; 'importance': generate it with probability a = "
        "sqrt(t/(1-t) * (1-q)/q) (1 up to the threshold t, at least "
        "selection.min_acceptance) and weight its samples' advantages by 1/a (normalised "
        "to mean 1 over the batch), so the update sees, in expectation, what it would see "
        "without selection (policy-gradient algorithms; selection/weight_mean).",
    )
    min_acceptance: float = Field(
        0.1,
        gt=0,
        le=1,
        description="acceptance=importance: the least chance an item is generated, so a "
        "weight is at most 1/min_acceptance.",
    )
    max_candidates: int = Field(
        64,
        ge=1,
        description="likelihood: each issued item gets up to this many candidates from the "
        "task source, scored together in one engine step; the first the gate accepts is "
        "generated, accepted ones after it go back to the pool. How many: enough that all "
        "are skipped with probability <= 0.1 at the skip rate since the last weight "
        "version. 1: one candidate per item (each skip a round trip through the stream).",
    )
    score_ahead: int = Field(
        8,
        ge=0,
        description="likelihood, at stream.max_staleness >= 1 (unused otherwise): a rollout "
        "worker with nothing to generate (the stream admits no more items until the trainer "
        "consumes) scores fresh candidates ahead instead of idling, until enough are "
        "accepted for this many batches, then scores the held ones again at newer weights. "
        "Those are issued first and generated without scoring again while their decision is "
        "at most this many weight versions old; older ones are scored again when issued. "
        "Not while the trainer evaluates. Counted in selection/ahead/{scored,rescored,"
        "reskipped,issued,expired,dropped}. 0: off.",
    )
    success_threshold: float = Field(
        0.5, description="A sample counts as a success when its reward is above this."
    )
    max_skips_in_a_row: int = Field(
        100,
        ge=1,
        description="After this many skips in a row the next item is issued anyway "
        "(counted as selection/forced), so a source of only easy prompts cannot stall. "
        "likelihood: candidates skipped since any was generated; the next item is "
        "generated without the gate.",
    )
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    hints: HintsConfig = Field(
        default_factory=HintsConfig,
        description="kind=hints: hints (a prefix of the reference solution) for prompts "
        "whose groups come out all wrong, shortened as the policy improves on them.",
    )

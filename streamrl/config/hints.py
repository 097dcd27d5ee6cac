"""Config of the two ways out for prompts the policy never solves: hints
(``selection.hints``, with ``selection.kind: hints``) and SFT interleaved with RL
(``algorithm.interleaved_sft``). The mechanisms are :mod:`streamrl.rollout.selection.hints`
and :mod:`streamrl.algorithms.interleaved_sft`; each reads its own section only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrl.config.base import Section


def solution_format(value: str) -> str:
    """A ``solution_format`` must place the solution."""
    if "{solution}" not in value:
        raise ValueError("solution_format must contain {solution}")
    return value


class HintsConfig(Section):
    """Hints for prompts whose groups come out all wrong (``selection.kind: hints``)."""

    mode: Literal["prefix", "prompt"] = Field(
        "prefix",
        description="prefix: the hint is a forced prefix of the completion (its tokens are "
        "masked from the loss and carry no log-prob credit; rollout.episode single_turn); "
        "prompt: the hint is appended to the prompt (hint_template).",
    )
    threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="A prompt gets hints once its Beta posterior over unhinted groups "
        "(prior Beta(prior_alpha, prior_beta)) predicts P(all group_size samples wrong) above "
        "this; with the Beta(1, 1) prior one all-wrong group does.",
    )
    initial_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Hint length of a newly hinted prompt, as a share of the "
        "reference solution's tokens.",
    )
    step: float = Field(
        0.25,
        gt=0,
        le=1,
        description="A hinted group with a success share >= shorten_above shortens the hint by "
        "this share of the solution (at 0 the prompt goes back to unhinted groups, its "
        "posterior reset); an all-wrong hinted group lengthens it by this much.",
    )
    shorten_above: float = Field(0.5, gt=0, le=1, description="See step.")
    max_fraction: float = Field(0.75, gt=0, le=1, description="The longest hint.")
    revisit_share: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="A prompt that needs a hint is issued again (its next group) ahead of "
        "fresh items, as long as revisits are at most this share of the issued items; 0: a "
        "hinted prompt waits until the task source yields it again.",
    )
    max_revisits: int = Field(
        16, ge=1, description="Revisits of one prompt before it waits for the source again."
    )
    max_queue: int = Field(
        256, ge=1, description="Prompts waiting for a revisit (the oldest is dropped, counted)."
    )
    solution_format: str = Field(
        "{solution}",
        description="The reference solution as the completion should read it, e.g. "
        "'<answer>{solution}</answer>'; the hint is a prefix of this.",
    )
    hint_template: str = Field(
        "{prompt}\n\nHint: the answer begins with: {hint}",
        description="mode=prompt: the hinted prompt (the last user message in chat).",
    )

    @field_validator("solution_format")
    @classmethod
    def _solution_format(cls, value: str) -> str:
        return solution_format(value)

    @field_validator("hint_template")
    @classmethod
    def _hint_template(cls, value: str) -> str:
        if "{hint}" not in value or "{prompt}" not in value:
            raise ValueError("hint_template must contain {prompt} and {hint}")
        return value

    @model_validator(mode="after")
    def _fractions(self) -> HintsConfig:
        if self.initial_fraction > self.max_fraction:
            raise ValueError("initial_fraction must be <= max_fraction")
        return self


class InterleavedSFTConfig(Section):
    """Demonstrations mixed into RL steps (any policy-gradient algorithm)."""

    share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of each training batch's rows that are demonstrations (held over "
        "steps; fewer while the buffer has too few). 0: off.",
    )
    weight: float = Field(
        0.1, ge=0, description="Weight of the demonstrations' NLL against the RL loss."
    )
    source: Literal["successes", "file", "reference"] = Field(
        "successes",
        description="successes: the policy's own verified successes (hinted ones included, "
        "hint tokens trained), kept in a small buffer, one per prompt; file: demonstrations "
        "from `path` (JSONL rows with prompt or messages, and answer); reference: a prompt "
        "whose group comes out all wrong (dropped by dynamic sampling) gets its item's "
        "reference answer, rendered with solution_format, as its demonstration (ReLIFT).",
    )
    path: str | None = Field(None, description="source=file: the demonstrations' JSONL file.")
    solution_format: str = Field(
        "{solution}",
        description="source=reference: the demonstration's completion, e.g. "
        "'<answer>{solution}</answer>' ({solution}: the item's reference answer).",
    )
    buffer_size: int = Field(
        64, ge=1, description="source=successes or reference: prompts kept (the oldest dropped)."
    )
    success_threshold: float = Field(
        0.5, description="A sample is a success when its reward is above this."
    )

    @field_validator("solution_format")
    @classmethod
    def _solution_format(cls, value: str) -> str:
        return solution_format(value)

    @model_validator(mode="after")
    def _path(self) -> InterleavedSFTConfig:
        if self.source == "file" and self.share > 0 and not self.path:
            raise ValueError("source=file needs path")
        return self

"""The config sections of the stages that run before RL: ``sft``, ``dpo`` and ``alol``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from streamrl.config.base import LRSchedule, Section


class SFTConfig(Section):
    steps: int = Field(
        3000,
        ge=0,
        description="Supervised warm-start steps before RL (0 = off); with sft.stop_at_eval, "
        "the most it may take.",
    )
    examples_per_step: int = Field(64, ge=1, description="Demonstrations per SFT step.")
    lr: float = Field(2e-3, gt=0, description="SFT peak learning rate.")
    lr_schedule: LRSchedule = Field(
        "cosine", description="SFT learning-rate schedule (decay over sft.steps)."
    )
    warmup_steps: int = Field(50, ge=0, description="SFT steps of linear warm-up from 0.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final SFT learning rate of linear/cosine decay."
    )
    corrupt_fraction: float = Field(
        0.3, ge=0, le=1, description="Fraction of demonstrations with a corrupted answer."
    )
    eval_every: int = Field(
        100, ge=0, description="Greedy held-out evaluation every N SFT steps (0 = none)."
    )
    stop_at_eval: float | None = Field(
        0.9,
        description="End SFT (and go on to RL) at the first evaluation (sft.eval_every) whose "
        "held-out greedy accuracy reaches this; sft.steps is then the most SFT may take "
        "(None, or sft.eval_every=0: always sft.steps).",
    )


class _OfflineStage(Section):
    """What the offline language-model stages (DPO, A-LoL) share: a logged-data file and
    an optimizer schedule of their own (each stage starts a fresh AdamW)."""

    steps: int = Field(0, ge=0, description="Optimizer steps of this stage (0 = off).")
    path: str | None = Field(None, description="The stage's JSONL file (needed when steps > 0).")
    lr: float = Field(1e-4, gt=0, description="Peak learning rate of this stage.")
    lr_schedule: LRSchedule = Field("constant", description="Learning-rate schedule.")
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warm-up from 0.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final learning rate of linear/cosine decay, as a fraction."
    )
    # no evaluation inside these stages (SFT's sft.eval_every, sft.stop_at_eval): not keys
    eval_every: ClassVar[int] = 0
    stop_at_eval: ClassVar[float | None] = None


class DPOConfig(_OfflineStage):
    """Direct preference optimisation on logged pairs, after SFT and before RL."""

    pairs_per_step: int = Field(16, ge=1, description="Preference pairs per DPO step.")
    beta: float = Field(
        0.1, gt=0, description="DPO beta: strength of the implicit KL to the reference."
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="'sigmoid': DPO's -log sigmoid(beta * margin); 'ipo': IPO's "
        "(margin - 1 / (2 beta))^2; margin = the chosen-minus-rejected log-ratio to the reference.",
    )


class ALoLConfig(_OfflineStage):
    """A-LoL: advantage-weighted offline policy gradient on logged completions with
    rewards, after SFT and DPO and before RL."""

    examples_per_step: int = Field(16, ge=1, description="Logged completions per A-LoL step.")
    clip: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="The sequence importance weight pi/pi_ref is clipped to "
        "[1 - clip, 1 + clip] (A-LoL's epsilon; 0.9 in the paper).",
    )
    baseline: Literal["prompt_mean", "global_mean"] = Field(
        "prompt_mean",
        description="Value estimate V(x) of the advantage R - V(x): 'prompt_mean', the mean "
        "logged reward of the prompt (a Monte-Carlo estimate of V_ref when the log was "
        "sampled from the reference, as `streamrl data log-completions` does; prompts with one "
        "row use the global mean); 'global_mean', the mean of all logged rewards.",
    )
    sampling: Literal["priority", "uniform"] = Field(
        "priority",
        description="How positive-advantage rows are drawn: 'priority' in proportion to "
        "their advantage (A-LoL's best variant), 'uniform' at random.",
    )

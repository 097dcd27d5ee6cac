"""The ``monitors`` config section: the reward-hacking monitors that watch every RL run.

Each monitor reads the step's metrics row, writes its statistic (``monitor/<name>``) and
whether it fired (``monitor_fired/<name>``), and when it fires logs one warning line (the
console and ``run.log``); with ``action: stop`` it ends the run after that step
(``summary.json`` status ``stopped_by_monitor``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.config.base import Section

Action = Literal["warn", "stop"]


class Rule(Section):
    enabled: bool = Field(True, description="Watch for this (cheap: it reads the metrics row).")
    threshold: float = Field(0.0, description="The statistic past which the monitor fires.")
    action: Action = Field("warn", description="'warn': log a line; 'stop': end the run.")


class LengthDrift(Rule):
    threshold: float = Field(
        1.0,
        description="Mean response length over the last `window` steps relative to the baseline's, "
        "minus 1 (1.0: it doubled).",
    )


class LengthJump(Rule):
    threshold: float = Field(
        1.0,
        description="One step's mean response length relative to the previous step's, minus 1.",
    )


class ComponentDominance(Rule):
    threshold: float = Field(
        0.8,
        description="Share of one reward component (not reward.correct_reward) in the summed |weight "
        "x mean| of the weighted components (two or more).",
    )


class EntropyCollapse(Rule):
    threshold: float = Field(
        0.8,
        description="Fall of the sampled tokens' mean negative log-prob (an entropy estimate) "
        "relative to its baseline (0.8: to a fifth).",
    )


class KLAcceleration(Rule):
    threshold: float = Field(
        0.05,
        description="Growth of the KL metric (kl to the reference) over the last `window` steps minus "
        "its growth over the `window` before (nats).",
    )


class RewardDivergence(Rule):
    threshold: float = Field(
        0.1,
        description="Between two evaluations, the rise of the training reward while held-out accuracy "
        "fell: the smaller of the two changes.",
    )


class JudgeSaturation(Rule):
    threshold: float = Field(
        0.95,
        description="Mean score of a judge component (llm_judge, reward_model, *_judge) over a step, "
        "its scores in [0, 1].",
    )


class JudgeDisagreement(Rule):
    threshold: float = Field(
        0.5,
        description="Fraction of answers where a judge (score >= 0.5) and reward.correct_reward (>= "
        "1) disagree, where both scored the answer.",
    )


class MonitorsConfig(Section):
    enabled: bool = Field(True, description="Run the reward-hacking monitors at all.")
    window: int = Field(
        3,
        ge=1,
        description="Steps averaged for a baseline or a trend (the first `window` steps are "
        "the baseline; a monitor is quiet until it has one).",
    )
    length_drift: LengthDrift = Field(default_factory=LengthDrift)
    length_jump: LengthJump = Field(default_factory=LengthJump)
    component_dominance: ComponentDominance = Field(default_factory=ComponentDominance)
    entropy_collapse: EntropyCollapse = Field(default_factory=EntropyCollapse)
    kl_acceleration: KLAcceleration = Field(default_factory=KLAcceleration)
    reward_divergence: RewardDivergence = Field(default_factory=RewardDivergence)
    judge_saturation: JudgeSaturation = Field(default_factory=JudgeSaturation)
    judge_disagreement: JudgeDisagreement = Field(default_factory=JudgeDisagreement)

"""The ``reward`` config section: the reward functions, their weights and isolation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from streamrl.config.base import Section


class RewardComponent(Section):
    name: str = Field(description="Registered reward function name, e.g. 'numeric_match'.")
    weight: float = Field(1.0, description="Weight of this component in the total reward.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options.")
    domains: list[str] | None = Field(
        None,
        description="Score only items of these domains (a mixture source's names); "
        "None: every item.",
    )


class RewardConfig(Section):
    components: list[RewardComponent] = Field(
        default_factory=lambda: [RewardComponent(name="numeric_match")],
        description="Reward functions summed with their weights.",
    )
    correct_reward: str = Field(
        "numeric_match", description="Reward whose value >= 1 counts as a correct answer."
    )
    timeout_s: float = Field(5.0, gt=0, description="A reward running longer is a failure.")
    isolation: Literal["thread", "process"] = Field(
        "thread",
        description="'thread': rewards run in worker threads of the rollout process (fast; a "
        "hung reward is abandoned). 'process': in a pool of worker processes (pebble) that "
        "are killed and replaced on a timeout, crash (segfault) or memory-limit breach.",
    )
    memory_limit_mb: int | None = Field(
        2048,
        ge=64,
        description="isolation=process: how much address space a reward worker may grow "
        "beyond its size at start-up (a reward that leaks past it fails, and its worker is "
        "replaced); None = no limit.",
    )

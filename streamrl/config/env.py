"""The ``env`` config section: how the environment episode (``rollout.episode: env``)
plays a text environment. :mod:`streamrl.config.schema` assembles it into ``Config``."""

from __future__ import annotations

from pydantic import Field

from streamrl.config.base import Section


class EnvConfig(Section):
    max_turns: int = Field(
        32,
        ge=1,
        description="Turns of one episode, every seat's together; an environment that has "
        "not ended by then fails the episode (env/errors/max_turns).",
    )
    max_total_tokens: int = Field(
        1024,
        ge=2,
        description="Tokens one seat's trajectory may hold (its prompt, observations and "
        "turns); a seat whose next observation would not fit ends the episode without an "
        "outcome, not trained on (env/truncated). At most the model's context.",
    )
    system_prompt: str | None = Field(
        None, description="A system message put first in every policy seat's conversation."
    )
    step_timeout_s: float = Field(
        30.0,
        gt=0,
        description="An environment's reset, step or close running longer fails the "
        "episode (env/errors/timeout); the call is abandoned on its thread.",
    )

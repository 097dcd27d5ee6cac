"""The ``endpoint`` config section: the OpenAI-compatible endpoint for external agents."""

from __future__ import annotations

from pydantic import Field

from streamrl.config.base import Listener


class EndpointConfig(Listener):
    """The OpenAI-compatible endpoint for external agents (``streamrl serve``)."""

    enabled: bool = Field(
        False,
        description="Serve /v1/chat/completions and train on the recorded sessions "
        "instead of running rollout workers (`streamrl serve` sets it).",
    )
    session_timeout_s: float = Field(
        300.0, gt=0, description="A session idle this long without a reward is a failed item."
    )
    tool_parser: str = Field(
        "hermes", description="How tool calls are parsed from completions (see agent.tool_parser)."
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="Largest request body; a larger one gets 413 before it is parsed.",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Longest rendered prompt of a call, in tokens (default: the model's "
        "context less one token); a longer one gets 400.",
    )

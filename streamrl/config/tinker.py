"""Config section of the Tinker-compatible training service (``tinker.*``, served by
``streamrl serve --api tinker``), assembled into ``Config`` by :mod:`streamrl.config.schema`;
the service itself is :mod:`streamrl.stream.endpoint.tinker`.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from streamrl.config.base import Listener


class TinkerConfig(Listener):
    """Where the service listens, which base models it serves, and its limits. The safety
    defaults are the OpenAI endpoint's: loopback, a token, limits on bodies and headers."""

    models: list[str] = Field(
        ["tiny-small", "tiny", "smollm2-135m-instruct"],
        description="Base models clients may train and sample: presets, "
        "'smollm2-135m-instruct', or local checkpoint directories. Each is loaded once, on "
        "first use, and shared (frozen) by every LoRA run on it; one whose source is "
        "missing is left out of the capabilities.",
    )
    state_dir: str = Field(
        "runs/tinker",
        description="Where checkpoints (save_state, save_weights_for_sampler), the token "
        "and the served models' tokenizer directories are written.",
    )
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha of every adapter.")
    max_runs: int = Field(
        16, ge=1, description="Training clients (LoRA adapters) held in memory at once."
    )
    max_samplers: int = Field(
        8,
        ge=1,
        description="Inference engines held at once (one per training run or base model "
        "sampled); the least recently used idle one is closed to make room.",
    )
    decode_slots: int = Field(
        16, ge=1, description="Sequences each sampling engine decodes together."
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest request body; a larger one gets 413 before it is parsed "
        "(clients split forward_backward batches into chunks below it).",
    )
    poll_s: float = Field(
        20.0,
        gt=0,
        le=40,
        allow_inf_nan=False,
        description="How long a retrieve_future call waits for its result before it answers "
        "try_again (the client's own timeout is 45 s).",
    )

    @field_validator("models")
    @classmethod
    def _some_model(cls, models: list[str]) -> list[str]:
        if not models:
            raise ValueError("list at least one base model")
        return models

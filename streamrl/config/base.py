"""``Section``, the base of every config section, and the types sections share."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from streamrl.config.options import non_finite


class Section(BaseModel):
    """The base of every config section: unknown keys are errors, assignments are
    validated, and no value holds a NaN or infinity (typed floats through
    ``allow_inf_nan=False``; free-form dictionaries and lists, such as ``options``,
    through the validator below)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, dict | list) and (found := non_finite(value)):
            raise PydanticCustomError(
                "finite_entry",
                "Input should be a finite number",
                {"path": ".".join(found[0]), "value": found[1]},
            )
        return value


LRSchedule = Literal["constant", "linear", "cosine"]


class Listener(Section):
    """What every served API (the OpenAI endpoint, the Tinker service) shares: where it
    listens and how long a slow client may take. Each section adds its own body limit."""

    host: str = Field("127.0.0.1", description="Interface to bind; loopback by default.")
    port: int = Field(0, ge=0, le=65535, description="TCP port (0: any free port).")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="A connection that has not sent a request's headers within this time "
        "is closed.",
    )
    read_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="A request body that has not fully arrived within this time gets 408.",
    )

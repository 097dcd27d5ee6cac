"""``Section``, the base of every config section, and the types sections share."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator
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

"""The ``credit`` config section: the knobs of turn-level and role-conditioned advantage
estimators (``algorithm.advantage: turn_discounted | gigpo | rae``).
:mod:`streamrl.config.schema` assembles it into ``Config``."""

from __future__ import annotations

from pydantic import Field

from streamrl.config.stages import _Section


class CreditConfig(_Section):
    gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="turn_discounted, gigpo: discount from one turn to the next (per turn, "
        "not per token).",
    )
    step_weight: float = Field(
        1.0, ge=0, description="gigpo: weight of the step-level (anchor state) advantage."
    )
    role_decay: float = Field(
        0.95,
        ge=0,
        lt=1,
        description="rae: decay of each (game, role) baseline, an exponential moving average "
        "of that role's returns.",
    )

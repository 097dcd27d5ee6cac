"""The ``stream`` config section: the staleness bound and the cap on items in flight."""

from __future__ import annotations

from pydantic import Field

from streamrl.config.base import Section


class StreamConfig(Section):
    max_staleness: int = Field(
        1, ge=0, description="eta: max trainer version minus oldest token version (0 = sync)."
    )
    max_inflight_items: int | None = Field(
        None,
        ge=1,
        description="Cap on items being generated at once (default: no cap beyond "
        "the staleness bound's (eta + 1) * train.items_per_step).",
    )

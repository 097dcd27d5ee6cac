"""The ``data`` config section: the task source and its options."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from streamrl.config.base import Section


class DataConfig(Section):
    kind: str = Field(
        "arithmetic",
        description="Registered task source kind: arithmetic, jsonl, parquet, datasets, "
        "reasoning_gym, longtail, or one added with register_task_source.",
    )
    options: dict[str, Any] = Field(
        default_factory=lambda: {"digits": 2, "operators": "+", "heldout_size": 500},
        description="Options for the task source (see docs/tasks.md), checked "
        "against the types its signature declares before the run starts. File sources "
        "(jsonl, parquet, datasets) take max_row_bytes: the most one row may take "
        "(default 8 MiB; a larger row is an error naming its file and line).",
    )
    max_too_long_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Before the run, the first 1000 training prompts and the held-out "
        "prompts are tokenized: one that leaves no room in the model's context for a "
        "generated token is filtered during the run (prompt_too_long; in evaluation, "
        "incorrect). More than this fraction of either, or all of them, fails the run.",
    )

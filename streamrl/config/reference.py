"""The reference of every config key, generated from the schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from streamrl.config.base import Section
from streamrl.config.schema import Config


def config_reference() -> str:
    """A Markdown table of every config key, its type, default and help text."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    top = Config.model_fields
    for name, field in top.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, Section):
            for sub, f in section.model_fields.items():
                rows.append(_reference_row(f"{name}.{sub}", f))
        else:
            rows.append(_reference_row(name, field))
    return "\n".join(rows)


def _reference_row(key: str, field: Any) -> str:
    annotation = getattr(field.annotation, "__name__", None) or str(field.annotation)
    annotation = annotation.replace("typing.", "").replace("|", "\\|")
    default = field.default_factory() if field.default_factory else field.default
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    if isinstance(default, list):
        default = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in default]
    shown = str(default).replace("|", "\\|")
    return f"| `{key}` | {annotation} | `{shown}` | {field.description or ''} |"

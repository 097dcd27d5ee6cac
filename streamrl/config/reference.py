"""The reference of every config key, generated from the schema: ``docs/config.md``.

``streamrl config --reference > docs/config.md`` writes it; a test fails when the
committed file differs from what the schema gives. One section per top-level key, a
nested section (``algorithm.ppo``, ``rollout.vllm``, ``reward.components``) after its
parent, each a table of its keys: type, default and description, all from the fields'
declarations.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from streamrl.config.base import Section
from streamrl.config.loading import RENAMED_KEYS, RENAMED_VALUES
from streamrl.config.schema import Config

REGENERATE = "streamrl config --reference > docs/config.md"

_INTRO = f"""# Config reference

Every key of a streamrl config: its type, default and meaning, section by section.
A config is a YAML file plus dotted `key=value` overrides
(`streamrl train examples/smoke.yaml train.steps=20`); an unknown key, a wrong type or a
renamed key is an error that names the file, line and key.

Generated from the schema (`streamrl/config/`) by `{REGENERATE}`;
do not edit it by hand: a test fails when this file and the schema differ.
"""


def config_reference() -> str:
    """The Markdown reference of every config key (the text of ``docs/config.md``)."""
    top = [(name, f) for name, f in Config.model_fields.items() if _section(f.annotation) is None]
    parts = [_INTRO, "## Top level\n", _table([(name, f) for name, f in top])]
    for name, field in Config.model_fields.items():
        section = _section(field.annotation)
        if section is not None:
            parts += _section_parts(name, section, level=2)
    return "\n".join([*parts, _renamed()])


def _renamed() -> str:
    """The keys (and values) of earlier versions: a config that uses one is refused with
    an error naming its new spelling."""
    lines = [
        "## Renamed keys\n",
        "A config that uses a key (or value) of an earlier version is refused with one line",
        "naming its new spelling.\n",
        "| old key | now |",
        "|---|---|",
    ]
    lines += [f"| `{old}` | {_cell(new)} |" for old, new in RENAMED_KEYS.items()]
    lines += ["", "| key | old value | now |", "|---|---|---|"]
    lines += [
        f"| `{key}` | `{old}` | `{new}` |"
        for key, values in RENAMED_VALUES.items()
        for old, new in values.items()
    ]
    return "\n".join(lines) + "\n"


def _section(annotation: Any) -> type[Section] | None:
    """The section class of a field that holds one (or a list of them), else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args:
        annotation = args[0]
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    return None


def _section_parts(key: str, section: type[Section], level: int) -> list[str]:
    """The heading, description and table of one section, then its nested sections."""
    doc = section.__dict__.get("__doc__")
    parts = [f"{'#' * level} {key}\n"]
    if doc:
        parts.append(" ".join(doc.split()) + "\n")
    fields = list(section.model_fields.items())
    parts.append(_table([(f"{key}.{name}", f) for name, f in fields]))
    for name, field in fields:
        nested = _section(field.annotation)
        if nested is not None:
            parts += _section_parts(f"{key}.{name}", nested, level=min(level + 1, 4))
    return parts


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    lines += [_row(key, field) for key, field in rows]
    return "\n".join(lines) + "\n"


def _row(key: str, field: Any) -> str:
    nested = _section(field.annotation)
    if nested is not None:  # a nested section: its keys follow under its own heading
        shown = "list of sections" if typing.get_origin(field.annotation) is list else "section"
        default = _default(field) if shown != "section" else "see below"
        return f"| `{key}` | {shown} | `{_cell(default)}` | {_cell(field.description or '')} |"
    default = _default(field)
    return (
        f"| `{key}` | {_cell(type_name(field.annotation))} | `{_cell(default)}` "
        f"| {_cell(field.description or '')} |"
    )


def _default(field: Any) -> Any:
    default = field.default_factory() if field.default_factory else field.default
    if isinstance(default, BaseModel):
        return default.model_dump(mode="json")
    if isinstance(default, list):
        return [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in default]
    return default


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int``, ``float | None``, ``list[int]``,
    ``'none' | 'tis'`` (the values a Literal allows)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("Any" if a is Any else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _cell(value: Any) -> str:
    """Text for a Markdown table cell: pipes escaped, on one line."""
    return " ".join(str(value).split()).replace("|", "\\|")

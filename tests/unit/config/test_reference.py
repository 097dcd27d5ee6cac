"""docs/config.md is the schema's reference: every key, its type, default and meaning."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from streamrl.cli.main import main
from streamrl.config import RENAMED_KEYS, Config, config_reference
from streamrl.config.reference import REGENERATE, type_name
from tests.paths import ROOT

DOC = ROOT / "docs" / "config.md"


def test_the_committed_reference_is_the_schemas() -> None:
    if DOC.read_text() != config_reference():
        pytest.fail(
            f"docs/config.md differs from the config schema: regenerate it with `{REGENERATE}`"
        )


def _keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, bool]]:
    """(key, holds a section) of every key of the schema, nested sections (and a list's
    section) included."""
    out = []
    for name, field in model.model_fields.items():
        key, ann = f"{prefix}{name}", field.annotation
        args = typing.get_args(ann)
        inner = args[0] if typing.get_origin(ann) is list and args else ann
        section = isinstance(inner, type) and issubclass(inner, BaseModel)
        out.append((key, section))
        if section:
            out += _keys(inner, f"{key}.")
    return out


def test_every_key_has_a_row_and_every_section_a_heading() -> None:
    text = config_reference()
    keys = _keys(Config)
    assert ("algorithm.ppo.gae_lambda", False) in keys and ("reward.components", True) in keys
    for key, section in keys:
        if "." in key or not section:  # a top-level section is a heading, the rest rows
            assert f"| `{key}` |" in text, key
        if section:
            assert f"# {key}\n" in text, key
    assert (
        "| `algorithm.correction.kind` | 'none' \\| 'tis' \\| 'mis' \\| 'icepop' | `none` |" in text
    )
    assert "## algorithm\n" in text and "### algorithm.offline\n" in text


def test_the_command_prints_the_reference(capsys) -> None:
    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == config_reference()


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (int, "int"),
        (float | None, "float | None"),
        (list[int], "list[int]"),
        (dict[str, Any], "dict[str, Any]"),
        (Literal["k1", "k2"], "'k1' | 'k2'"),
        (typing.Optional[str], "str | None"),  # noqa: UP045 (the typing spelling too)
    ],
)
def test_types_read_as_written(annotation: Any, shown: str) -> None:
    assert type_name(annotation) == shown


def test_every_renamed_key_is_listed_with_its_new_name() -> None:
    text = config_reference().split("## Renamed keys\n", 1)[1]
    for old, new in RENAMED_KEYS.items():
        assert f"| `{old}` | {new} |" in text, old
    assert "| `algorithm.name` | `gae` | `ppo` |" in text

"""Logged language-model data for the offline stages, read from JSONL.

==============  ==========================================================  =============
stage           row                                                         fields
==============  ==========================================================  =============
``dpo``         ``{"prompt": "12+34=", "chosen": "46", "rejected": "47"}``  ``chosen``,
                                                                            ``rejected``:
                                                                            strings
``alol``        ``{"prompt": "12+34=", "completion": "46", "reward": 1}``   ``completion``:
                                                                            string;
                                                                            ``reward``:
                                                                            finite number
==============  ==========================================================  =============

The prompt side of a row follows the task-source schema of :mod:`streamrl.sources.files`
(``prompt`` text **or** chat ``messages``, optional ``id``, ``answer`` and ``metadata``;
other columns go to metadata), parsed by the same :class:`~streamrl.sources.files.RowParser`,
so a prompt is rendered exactly as the task source renders it. Every row is validated
when the file is read; the first bad one raises a :class:`~streamrl.sources.base.DataError`
naming the file, the line and the field, e.g.
``prefs.jsonl:3: field 'chosen': missing (each row needs 'chosen' and 'rejected')``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.core.types import Item
from streamrl.sources.base import DataError
from streamrl.sources.files import RowParser, _type_name, jsonl_records

PREFERENCE_FIELDS = ("chosen", "rejected")
COMPLETION_FIELDS = ("completion", "reward")


@dataclass(frozen=True)
class PreferencePair:
    """A prompt with a preferred and a dispreferred completion (``line``: 1-based)."""

    item: Item
    chosen: str
    rejected: str
    line: int


@dataclass(frozen=True)
class LoggedCompletion:
    """A prompt, one completion of it and the completion's reward (``line``: 1-based)."""

    item: Item
    completion: str
    reward: float
    line: int


def _rows(path: str | Path, fields: tuple[str, ...]) -> list[tuple[int, Item, dict[str, Any]]]:
    """(line, prompt item, raw row) of every row; ``fields`` are taken out of the metadata."""
    source, parser, out = str(path), RowParser(), []
    for line, _, raw in jsonl_records(source):
        assert line is not None
        item = parser.parse(raw, source, line, None)
        for name in fields:
            item.metadata.pop(name, None)
            if name not in raw or raw[name] is None:
                raise DataError(
                    source,
                    f"missing (each row needs {' and '.join(repr(f) for f in fields)})",
                    line=line,
                    field=name,
                )
        out.append((line, item, raw))
    if not out:
        raise DataError(source, "no rows: the file is empty")
    return out


def _text(raw: dict[str, Any], name: str, source: str, line: int) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise DataError(
            source, f"expected a string, got {_type_name(value)}", line=line, field=name
        )
    return value  # may be empty: a model that stops at once (EOS) completed with ""


def load_preferences(path: str | Path) -> list[PreferencePair]:
    """Every row of a preference JSONL file, validated (see the module docstring)."""
    source, pairs = str(path), []
    for line, item, raw in _rows(path, PREFERENCE_FIELDS):
        chosen = _text(raw, "chosen", source, line)
        rejected = _text(raw, "rejected", source, line)
        if chosen == rejected:
            raise DataError(
                source,
                "identical to 'chosen': a pair carries no preference",
                line=line,
                field="rejected",
            )
        item.index = len(pairs)
        pairs.append(PreferencePair(item, chosen, rejected, line))
    return pairs


def load_completions(path: str | Path) -> list[LoggedCompletion]:
    """Every row of a logged-completions JSONL file, validated (see the module docstring).
    A reward must be a finite number: NaN, infinities, booleans and strings are errors."""
    source, rows = str(path), []
    for line, item, raw in _rows(path, COMPLETION_FIELDS):
        completion = _text(raw, "completion", source, line)
        reward = raw["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise DataError(
                source, f"expected a number, got {_type_name(reward)}", line=line, field="reward"
            )
        if not math.isfinite(reward):
            raise DataError(
                source, f"expected a finite number, got {reward}", line=line, field="reward"
            )
        item.index = len(rows)
        rows.append(LoggedCompletion(item, completion, float(reward), line))
    return rows

"""An item's rubric: the criteria a judge scores an answer on, each with a weight.

In a data file a rubric is the row's ``rubric`` field (or ``metadata.rubric``): a list
of criteria, each an object with ``criterion`` (what the judge checks, a non-empty
string), ``weight`` (a positive number, default 1) and ``name`` (a short name for the
metrics, ``reward/rubric_judge/<name>``; a letter or digit, then letters, digits, ``_``, ``-``, ``.``; default
``c<k>``, k counting from 1; unique within the rubric). The file sources check it with
the row (:class:`~streamrl.sources.base.DataError` naming the file, the line and the
field, e.g. ``rubric[1].weight``); ``rubric_judge`` checks it again on items from any
other source.

>>> parse_rubric([{"criterion": "Gives the sum", "weight": 2}, {"criterion": "Is short"}])
[{'name': 'c1', 'criterion': 'Gives the sum', 'weight': 2.0}, {'name': 'c2', 'criterion': 'Is short', 'weight': 1.0}]
>>> parse_rubric([{"criterion": "x", "weight": 0}])
Traceback (most recent call last):
...
streamrl.sources.rubrics.RubricError: rubric[0].weight: expected a positive number, got 0
"""

from __future__ import annotations

import math
import re
from typing import Any

RUBRIC_KEY = "rubric"
KEYS = ("criterion", "weight", "name")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class RubricError(ValueError):
    """A malformed rubric: ``field`` is the path inside the row (``rubric[1].weight``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _criterion(raw: Any, k: int, names: set[str]) -> dict[str, Any]:
    at = f"{RUBRIC_KEY}[{k}]"
    if not isinstance(raw, dict):
        raise RubricError(
            at, f"expected an object with 'criterion' and 'weight', got {_type_name(raw)}"
        )
    if unknown := sorted(set(raw) - set(KEYS)):
        raise RubricError(f"{at}.{unknown[0]}", f"unknown key; accepted: {', '.join(KEYS)}")
    text = raw.get("criterion")
    if not isinstance(text, str) or not text.strip():
        raise RubricError(f"{at}.criterion", f"expected a non-empty string, got {text!r}")
    weight = raw.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise RubricError(f"{at}.weight", f"expected a positive number, got {weight!r}")
    name = raw.get("name", f"c{k + 1}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RubricError(
            f"{at}.name",
            f"expected a letter or digit, then letters, digits, '_', '-', '.'; got {name!r}",
        )
    if name in names:
        raise RubricError(f"{at}.name", f"duplicate criterion name {name!r}")
    names.add(name)
    return {"name": name, "criterion": text, "weight": float(weight)}


def parse_rubric(value: Any) -> list[dict[str, Any]]:
    """``value`` as a checked rubric (a list of ``{name, criterion, weight}``); a
    :class:`RubricError` naming the field otherwise."""
    if not isinstance(value, list) or not value:
        raise RubricError(RUBRIC_KEY, f"expected a non-empty list of criteria, got {value!r}"[:200])
    names: set[str] = set()
    return [_criterion(raw, k, names) for k, raw in enumerate(value)]

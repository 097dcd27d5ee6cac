"""Check a call's arguments against a tool's JSON schema, with messages for the model.

The schema is the one ``transformers.utils.get_json_schema`` makes from a signature:
``{"type": "object", "properties": {...}, "required": [...]}`` under
``schema["function"]["parameters"]``, each property with a ``type`` (a name or a list
of names), maybe ``nullable``, ``enum`` (``Literal``) or ``items`` (``list[int]``).
Checks are strict where a model's mistake would silently change the meaning (the
string ``"3"`` is not an integer, ``true`` is not a number); the one coercion is an
integral float where an integer is expected (``3.0`` -> ``3``), which JSON cannot tell
apart anyway.

>>> schema = {"function": {"parameters": {"type": "object", "required": ["query"],
...     "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}}}}
>>> check_arguments(schema, {"query": "cats", "k": 2.0})
({'query': 'cats', 'k': 2}, [])
>>> check_arguments(schema, {"k": "2", "n": 1})[1]  # doctest: +NORMALIZE_WHITESPACE
[('missing_argument', "missing argument 'query' (a string)"),
 ('extra_argument', "unexpected argument 'n'; the arguments are: query, k"),
 ('bad_argument_type', "argument 'k' must be an integer, got the string '2'")]
"""

from __future__ import annotations

import math
from typing import Any

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def check_arguments(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``(arguments to call with, [(kind, message), ...])``; no problems means callable.

    Kinds, in this order: ``missing_argument``, ``extra_argument``, ``bad_argument_type``.
    """
    params = schema.get("function", schema).get("parameters", {})
    properties: dict[str, Any] = params.get("properties", {})
    required: list[str] = params.get("required", [])
    problems: list[tuple[str, str]] = []
    for name in required:
        if name not in arguments:
            expected = _expected(properties.get(name, {}))
            problems.append(("missing_argument", f"missing argument {name!r} ({expected})"))
    for name in arguments:
        if name not in properties:
            known = ", ".join(properties) or "none"
            problems.append(
                ("extra_argument", f"unexpected argument {name!r}; the arguments are: {known}")
            )
    coerced = dict(arguments)
    for name, value in arguments.items():
        if name in properties:
            coerced[name], error = check_value(value, properties[name], f"argument {name!r}")
            if error:
                problems.append(("bad_argument_type", error))
    return coerced, problems


def check_value(value: Any, schema: dict[str, Any], what: str) -> tuple[Any, str | None]:
    """``(value, None)`` when it matches ``schema`` (maybe coerced), else ``(value, message)``.

    >>> check_value(True, {"type": "integer"}, "argument 'k'")
    (True, "argument 'k' must be an integer, got the boolean true")
    >>> check_value([1, "2"], {"type": "array", "items": {"type": "integer"}}, "argument 'xs'")
    ([1, '2'], "argument 'xs'[1] must be an integer, got the string '2'")
    >>> check_value(None, {"type": "integer", "nullable": True}, "argument 'k'")
    (None, None)
    """
    if value is None and (schema.get("nullable") or "null" in _types(schema)):
        return value, None
    types = _types(schema)
    if types:
        for t in types:
            ok, converted = _matches(value, t)
            if ok:
                value = converted
                break
        else:
            return value, f"{what} must be {_expected(schema)}, got {_describe(value)}"
    if "enum" in schema and value not in schema["enum"]:
        options = ", ".join(repr(v) for v in schema["enum"])
        return value, f"{what} must be one of {options}, got {_describe(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for i, item in enumerate(value):
            item, error = check_value(item, schema["items"], f"{what}[{i}]")
            if error:
                return value, error
            items.append(item)
        value = items
    return value, None


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def _matches(value: Any, type_name: str) -> tuple[bool, Any]:
    """Whether ``value`` is of the JSON type, and the value to pass on."""
    if type_name == "string":
        return isinstance(value, str), value
    if type_name == "boolean":
        return isinstance(value, bool), value
    if type_name == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return False, value
    if type_name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool), value
    if type_name == "array":
        return isinstance(value, list | tuple), list(value) if isinstance(value, tuple) else value
    if type_name == "object":
        return isinstance(value, dict), value
    if type_name == "null":
        return value is None, value
    return True, value  # a type this check does not know: the tool decides


def _expected(schema: dict[str, Any]) -> str:
    """``"an integer"``, ``"a string or null"``, ``"a list of integers"``."""
    names = [_TYPE_NAMES.get(t, t) for t in _types(schema)]
    if schema.get("nullable"):
        names.append("null")
    if not names:
        return "any value"
    text = " or ".join(names)
    items = schema.get("items")
    if names == ["a list"] and isinstance(items, dict) and _types(items):
        text = "a list of " + " or ".join(_types(items)) + "s"
    return text


def _describe(value: Any) -> str:
    """The value as the model wrote it, in JSON words, cut to 40 characters."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        kind = "the string"
    elif isinstance(value, int):
        kind = "the integer"
    elif isinstance(value, float):
        kind = "the number"
    elif isinstance(value, list | tuple):
        kind = "the list"
    elif isinstance(value, dict):
        kind = "the object"
    else:
        kind = f"a {type(value).__name__}"
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"

"""Tool-call parsers, by format name: ``text -> (content without the calls, calls in order)``.

A parser never raises: a call it cannot read is a :class:`ParseError` in its place, which
``ToolSet.execute`` turns into an error observation of that kind.

``hermes`` (SmolLM2, Qwen): JSON objects between ``<tool_call>`` tags, any number a turn.

>>> content, calls = get_tool_parser("hermes")(
...     'Let me compute.\\n<tool_call>\\n{"name": "calculator", '
...     '"arguments": {"expression": "12*34"}}\\n</tool_call>')
>>> content, calls[0].name, calls[0].arguments
('Let me compute.', 'calculator', {'expression': '12*34'})

``pythonic`` (Llama-3.2 style, compact enough for a character tokenizer): a bracketed
list of calls with keyword arguments whose values are Python literals, read with ``ast``
(never ``eval``).

>>> content, calls = get_tool_parser("pythonic")(
...     'I will add. [calculator(expression="12*34"), search(query="cats", k=2)]')
>>> content, [(c.name, c.arguments) for c in calls]
('I will add.', [('calculator', {'expression': '12*34'}), ('search', {'query': 'cats', 'k': 2})])
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from streamrl.rollout.tools.base import ParseError, ToolCall

ToolParser = Callable[[str], tuple[str, list[ToolCall | ParseError]]]
P = TypeVar("P", bound=ToolParser)

_PARSERS: dict[str, ToolParser] = {}


def register_tool_parser(name: str) -> Callable[[P], P]:
    """Decorator: make ``parser(text) -> (content, calls)`` available by format name."""

    def decorator(fn: P) -> P:
        old = _PARSERS.get(name)
        if old is not None and _qualname(old) != _qualname(fn):  # a reload may re-register
            raise ValueError(f"tool parser {name!r} is already registered")
        _PARSERS[name] = fn
        return fn

    return decorator


def _qualname(fn: Callable[..., Any]) -> tuple[str | None, str]:
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn))


def tool_parser_names() -> list[str]:
    """Registered format names, sorted."""
    return sorted(_PARSERS)


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``.

    >>> get_tool_parser("xml")
    Traceback (most recent call last):
    ...
    ValueError: unknown tool parser 'xml'; known: hermes, pythonic
    """
    if name not in _PARSERS:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(tool_parser_names())}")
    return _PARSERS[name]


# --- hermes -------------------------------------------------------------------------------

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_HERMES_EXAMPLE = '<tool_call>{"name": "...", "arguments": {...}}</tool_call>'


@register_tool_parser("hermes")
def hermes(text: str) -> tuple[str, list[ToolCall | ParseError]]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, whitespace allowed.

    An unclosed last ``<tool_call>`` whose rest is a whole JSON call is still read (an
    episode may stop generating at ``</tool_call>``); otherwise it is ``unclosed_tag``
    (the turn was cut off). ``"parameters"`` is accepted for ``"arguments"``, and a
    call without either has no arguments.

    >>> _, calls = hermes('<tool_call>{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}</tool_call>'
    ...                   '<tool_call>{"name": "f", arguments: {}}</tool_call>')
    >>> calls[0].arguments, calls[0].issue
    ({'x': 1}, 'arguments_as_string')
    >>> calls[1].kind
    'invalid_json'
    """
    content: list[str] = []
    calls: list[ToolCall | ParseError] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) >= 0:
        content.append(text[pos:start])
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        if end < 0:
            calls.append(_hermes_call(text[body_start:], text[start:], closed=False))
            pos = len(text)
            break
        pos = end + len(CLOSE_TAG)
        calls.append(_hermes_call(text[body_start:end], text[start:pos], closed=True))
    content.append(text[pos:])
    return "".join(content).strip(), calls


def _hermes_call(body: str, raw: str, *, closed: bool) -> ToolCall | ParseError:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        if not closed:
            return ParseError(
                "unclosed_tag",
                f"the tool call has {OPEN_TAG} but no {CLOSE_TAG}; write {_HERMES_EXAMPLE}",
                raw,
            )
        where = f" ({exc.msg} at character {exc.pos})" if isinstance(exc, ValueError) else ""
        return ParseError(
            "invalid_json",
            f"the tool call is not valid JSON{where}; write {_HERMES_EXAMPLE}",
            raw,
        )
    if not isinstance(obj, dict):
        return ParseError(
            "not_an_object",
            f"a tool call must be a JSON object, got {_json_kind(obj)}; write {_HERMES_EXAMPLE}",
            raw,
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ParseError(
            "missing_name", f'the tool call has no "name" string; write {_HERMES_EXAMPLE}', raw
        )
    name = name.strip()
    arguments = obj.get("arguments", obj.get("parameters"))
    if arguments is None:
        return ToolCall(name, {}, raw)
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            return ToolCall(name, decoded, raw, issue="arguments_as_string")
        return ParseError(
            "arguments_as_string",
            f'{name}: "arguments" must be a JSON object, not a string; write {_HERMES_EXAMPLE}',
            raw,
            name,
        )
    if not isinstance(arguments, dict):
        return ParseError(
            "not_an_object",
            f'{name}: "arguments" must be a JSON object, got {_json_kind(arguments)}',
            raw,
            name,
        )
    return ToolCall(name, arguments, raw)


def _json_kind(value: Any) -> str:
    """The JSON kind of a value, for messages.

    >>> _json_kind([1]), _json_kind("x"), _json_kind(2.5), _json_kind(None)
    ('a list', 'a string', 'a number', 'null')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for types, word in ((str, "a string"), (list, "a list"), (int | float, "a number")):
        if isinstance(value, types):
            return word
    return f"a {type(value).__name__}"


# --- pythonic -----------------------------------------------------------------------------

_PYTHONIC_START = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")
_PYTHONIC_EXAMPLE = '[name(argument="value", other=2)]'
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


@register_tool_parser("pythonic")
def pythonic(text: str) -> tuple[str, list[ToolCall | ParseError]]:
    """``[name(key=literal, ...), ...]`` anywhere in the text, Llama-3.2 style.

    Every bracketed list that starts like a call is one or more calls. Values are Python
    literals (strings, numbers, booleans, None, lists, dicts) read by ``ast.literal_eval``.

    >>> [(c.kind if isinstance(c, ParseError) else None, c.raw) for c in pythonic(
    ...     '[f(1), g(x=y), h(x=1)] [k(x="unclosed)]')[1]]  # doctest: +NORMALIZE_WHITESPACE
    [('positional_argument', 'f(1)'), ('not_a_literal', 'g(x=y)'), (None, 'h(x=1)'),
     ('invalid_syntax', '[k(x="unclosed)]')]
    """
    content: list[str] = []
    calls: list[ToolCall | ParseError] = []
    pos = 0
    while match := _PYTHONIC_START.search(text, pos):
        start = match.start()
        content.append(text[pos:start])
        end = _closing_bracket(text, start)
        if end is None:
            message = f"the list of calls is not closed with ']'; write {_PYTHONIC_EXAMPLE}"
            calls.append(ParseError("invalid_syntax", message, text[start:]))
            pos = len(text)
            break
        calls.extend(_pythonic_calls(text[start:end]))
        pos = end
    content.append(text[pos:])
    return "".join(content).strip(), calls


def _closing_bracket(text: str, start: int) -> int | None:
    """The index after the bracket that closes ``text[start]``, skipping string literals.

    >>> _closing_bracket('[f(x="a]b", y=[1])] rest', 0)
    19
    >>> _closing_bracket('[f(x="a]")', 0) is None
    True
    """
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch in ")]}":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return i + 1
        i += 1
    return None


def _pythonic_calls(segment: str) -> list[ToolCall | ParseError]:
    try:
        tree = ast.parse(segment, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        message = f"the calls are not valid Python ({reason}); write {_PYTHONIC_EXAMPLE}"
        return [ParseError("invalid_syntax", message, segment)]
    if not isinstance(tree, ast.List):
        return [ParseError("not_a_call", f"write a list of calls: {_PYTHONIC_EXAMPLE}", segment)]
    return [_pythonic_call(segment, node) for node in tree.elts]


def _pythonic_call(segment: str, node: ast.expr) -> ToolCall | ParseError:
    raw = ast.get_source_segment(segment, node) or segment
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return ParseError("not_a_call", f"{raw!r} is not a call; write {_PYTHONIC_EXAMPLE}", raw)
    name = node.func.id
    if node.args:
        message = f"{name}: give every argument with its name, like {_PYTHONIC_EXAMPLE}"
        return ParseError("positional_argument", message, raw, name)
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return ParseError("not_a_literal", f"{name}: '**' is not allowed", raw, name)
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = ast.get_source_segment(segment, keyword.value) or "?"
            message = (
                f"{name}: the value of {keyword.arg!r} must be a literal (a quoted string, "
                f"a number, True/False, a list), got {value}"
            )
            return ParseError("not_a_literal", message, raw, name)
    return ToolCall(name, arguments, raw)

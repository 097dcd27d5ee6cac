"""Tool calls, their results, and the execution of a call against a set of typed functions.

A tool is a plain typed Python function with a Google-style docstring; its JSON schema
comes from ``transformers.utils.get_json_schema``, so the same dict goes to
``tokenizer.apply_chat_template(messages, tools=toolset.schemas)``. The episode parses
calls out of the generated text (``streamrl.rollout.tools.parsers``) and hands each one, parsed or
not, to :meth:`ToolSet.execute`, which never raises for the model's mistakes or the
tool's failures: every one becomes a :class:`ToolResult` whose ``content`` the model sees
and whose ``error`` names the kind, so that the episode can count them.

>>> def add(a: int, b: int) -> int:
...     '''Add two integers.
...
...     Args:
...         a: the first term
...         b: the second term
...     '''
...     return a + b
>>> tools = ToolSet([add])
>>> [s["function"]["name"] for s in tools.schemas]
['add']
>>> run = lambda call: asyncio.run(tools.execute(call))
>>> run(ToolCall("add", {"a": 2, "b": 3}, raw="")).content
'5'
>>> result = run(ToolCall("add", {"a": 2, "b": "3"}, raw=""))
>>> result.error, result.content
('bad_argument_type', "Error: add: argument 'b' must be an integer, got the string '3'")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrl.rollout.tools.validation import check_arguments


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: ``raw`` is its text.

    ``issue`` names a format problem the parser repaired (``"arguments_as_string"``: the
    arguments were a JSON string holding the object). The call still runs, and its result
    reports the issue as its ``error`` kind when nothing worse happened.
    """

    name: str
    arguments: dict[str, Any]
    raw: str
    issue: str | None = None


@dataclass(frozen=True)
class ParseError:
    """A call the parser could not read; ``message`` is shown to the model.

    ``name`` is the tool's name when the parser could still tell it, else ``""``.
    """

    kind: str
    message: str
    raw: str
    name: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: ``content`` is what the model sees (a value or an error text).

    ``error`` is None for a clean call, else the kind (see :data:`ERROR_KINDS`).
    ``final`` is True when the call gave the episode's final answer (``final_answer``).
    """

    name: str
    content: str
    error: str | None
    latency_s: float
    final: bool = False
    # what the tool reports beside the content, not shown to the model: the python tool's
    # isolation; numbers under "metrics" are summed into the episode's metrics
    metadata: dict[str, Any] = field(default_factory=dict)


# Every kind a ToolResult's ``error`` can hold, what it means.
ERROR_KINDS: dict[str, str] = {
    "invalid_json": "hermes: the text between the tags is not JSON",
    "invalid_syntax": "pythonic: the bracketed list is not a Python expression",
    "not_an_object": "hermes: the call or its arguments is not a JSON object",
    "missing_name": "the call names no tool",
    "unclosed_tag": "hermes: <tool_call> without </tool_call>, and no JSON after it",
    "not_a_call": "pythonic: an element of the list is not name(...)",
    "positional_argument": "pythonic: an argument is given without its keyword",
    "not_a_literal": "pythonic: an argument's value is not a Python literal",
    "arguments_as_string": "the arguments were a JSON string (decoded and run if possible)",
    "unknown_tool": "no tool of that name in the set",
    "missing_argument": "a required argument is missing",
    "extra_argument": "an argument the tool does not take",
    "bad_argument_type": "an argument's value does not match the schema's type",
    "tool_error": "the tool raised; the message shows the exception's type and text",
    "timeout": "the tool ran past its time limit (a thread is abandoned, a coroutine cancelled)",
    "sandbox_error": "the python tool's sandbox could not start (the code did not run)",
}


class ToolFailure(Exception):
    """Raised by a tool to report a failure of a given kind with a message for the model.

    >>> str(ToolFailure("timeout", "the program ran past 5s"))
    'the program ran past 5s'
    """

    def __init__(self, kind: str, message: str, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.metadata = metadata or {}


@dataclass(frozen=True)
class ToolOutput:
    """A tool's return value with metadata for the episode (``ToolResult.metadata``);
    the model sees only ``value``."""

    value: Any
    metadata: dict[str, Any]


class Tool:
    """A typed function the model can call, with its schema and time limit.

    ``name`` replaces the function's name in the schema (and is what the model calls).
    ``final=True`` marks a tool whose successful call ends the episode. Sync functions
    run in a daemon thread of their own, so a hung one is abandoned at ``timeout_s``
    without blocking the event loop or interpreter exit; async functions are cancelled.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        timeout_s: float = 10.0,
        final: bool = False,
    ) -> None:
        from transformers.utils import get_json_schema

        label = name or getattr(fn, "__name__", repr(fn))
        if timeout_s <= 0:
            raise ValueError(f"tool {label!r}: timeout_s must be > 0")
        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # a missing docstring or type hint: a programming error
            raise ValueError(f"tool {label!r}: no JSON schema: {exc}") from exc
        if name is not None:
            schema["function"]["name"] = name
        self.fn = fn
        self.name: str = schema["function"]["name"]
        self.schema: dict[str, Any] = schema
        self.timeout_s = float(timeout_s)
        self.final = final
        # an object with an ``async def __call__`` is async too
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, timeout_s={self.timeout_s})"

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        """The function's value; raises what it raises, or ``ToolFailure("timeout")``."""
        if self.is_async:
            running: asyncio.Future[Any] = asyncio.ensure_future(self.fn(**arguments))
        else:
            running = _in_thread(self.fn, arguments)
        try:
            done, _ = await asyncio.wait({running}, timeout=self.timeout_s)
        finally:
            if not running.done():  # past the limit, or the episode itself was cancelled
                running.cancel()
                running.add_done_callback(_retrieve)
        if not done:
            raise ToolFailure("timeout", f"did not finish within {self.timeout_s:g}s")
        return running.result()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's exception as seen (no "never retrieved" warning)."""
    if not future.cancelled():
        future.exception()


def _in_thread(fn: Callable[..., Any], arguments: dict[str, Any]) -> asyncio.Future[Any]:
    """Run ``fn(**arguments)`` in a new daemon thread; the future gets its value or error.

    Not ``asyncio.to_thread``: the default executor's threads are joined at interpreter
    exit, so one hung tool would hang the process; a daemon thread is simply abandoned.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        value, error = None, None
        try:
            value = fn(**arguments)
        except BaseException as exc:  # SystemExit too: it must not end a thread silently
            error = exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(
        target=target, name=f"tool-{getattr(fn, '__name__', 'fn')}", daemon=True
    ).start()
    return future


def to_content(value: Any) -> str:
    """A tool's return value as text: strings as they are, containers as JSON.

    >>> to_content("7"), to_content(7), to_content({"a": [1, 2]}), to_content(None)
    ('7', '7', '{"a": [1, 2]}', '')
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, dict | list | tuple):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


class ToolSet:
    """The tools of an episode, by name; :meth:`execute` runs one parsed call.

    Duplicate names are an error. Plain callables are wrapped in :class:`Tool` with its
    defaults.
    """

    def __init__(self, tools: Sequence[Tool | Callable[..., Any]]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            tool = t if isinstance(t, Tool) else Tool(t)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool

    def __repr__(self) -> str:
        return f"ToolSet({list(self.tools.values())!r})"

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def names(self) -> list[str]:
        """Tool names in the order given."""
        return list(self.tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas, for ``apply_chat_template(..., tools=schemas)``."""
        return [t.schema for t in self.tools.values()]

    async def execute(self, call: ToolCall | ParseError) -> ToolResult:
        """Run one call. Never raises for the model's or the tool's failures.

        Order of checks: a parse error, an unknown tool, the arguments against the schema
        (missing, extra, then types; the message lists every problem), then the run
        (``tool_error``, ``timeout``, or a kind the tool raised as :class:`ToolFailure`).
        A call the parser repaired (``call.issue``) that runs cleanly reports the issue as
        its ``error``, with the value as its content: a real failure outranks it.
        """
        if isinstance(call, ParseError):
            return ToolResult(call.name, f"Error: {call.message}", call.kind, 0.0)
        start = time.perf_counter()

        def result(
            content: str, error: str | None, final: bool = False, metadata: dict | None = None
        ) -> ToolResult:
            latency = time.perf_counter() - start
            return ToolResult(call.name, content, error, latency, final, metadata or {})

        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return result(f"Error: unknown tool {call.name!r}; tools: {known}", "unknown_tool")
        arguments, problems = check_arguments(tool.schema, call.arguments)
        if problems:
            kind = problems[0][0]
            text = "; ".join(message for _, message in problems)
            return result(f"Error: {tool.name}: {text}", kind)
        try:
            value = await tool(arguments)
        except ToolFailure as exc:
            return result(f"Error: {tool.name}: {exc.message}", exc.kind, metadata=exc.metadata)
        except (Exception, SystemExit) as exc:  # the tool's own failure, shown to the model
            return result(f"Error: {tool.name} raised {_describe(exc)}", "tool_error")
        metadata = None
        if isinstance(value, ToolOutput):
            value, metadata = value.value, value.metadata
        return result(to_content(value), call.issue, final=tool.final, metadata=metadata)


def _describe(exc: BaseException) -> str:
    """``"Type: text"``, one line (no traceback), the text cut to 500 characters.

    >>> _describe(ZeroDivisionError("division by zero"))
    'ZeroDivisionError: division by zero'
    """
    text = " ".join(str(exc).split())
    text = text if len(text) <= 500 else text[:499] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

"""Tools by name: built-ins and user tools, with per-tool options.

A registered entry is either a tool function (its only option is ``timeout_s``) or, with
``factory=True``, a function ``factory(**options) -> Tool | Callable`` that builds the
tool from its options (the ``search`` tool indexes its corpus there). The tool is
always named by its registered name.

>>> @register_tool("doc_double")
... def double(x: int) -> int:
...     '''Double a number.
...
...     Args:
...         x: the number
...     '''
...     return 2 * x
>>> tools = build_tools(["doc_double"], {"doc_double": {"timeout_s": 2.0}})
>>> tools.tools["doc_double"].timeout_s
2.0
>>> build_tools(["doc_double"], {"doc_double": {"scale": 3}})
Traceback (most recent call last):
...
ValueError: tool 'doc_double': unknown option 'scale' (it takes only timeout_s)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from streamrl.rollout.tools.base import Tool, ToolSet

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Entry:
    fn: Callable[..., Any]
    factory: bool
    final: bool


_TOOLS: dict[str, _Entry] = {}


def register_tool(name: str, *, factory: bool = False, final: bool = False) -> Callable[[F], F]:
    """Decorator: make a tool function (or, with ``factory=True``, a tool factory) available.

    ``final=True`` marks a tool whose successful call ends the episode (``final_answer``);
    a factory sets that on the :class:`Tool` it returns instead.
    """

    def decorator(fn: F) -> F:
        entry = _Entry(fn, factory, final)
        if name in _TOOLS and _key(_TOOLS[name]) != _key(entry):
            raise ValueError(f"tool {name!r} is already registered")
        _TOOLS[name] = entry
        return fn

    return decorator


def _key(entry: _Entry) -> tuple[Any, ...]:
    """Equal for the same function defined again (a reloaded module, a re-run doctest)."""
    fn = entry.fn
    return (
        getattr(fn, "__module__", None),
        getattr(fn, "__qualname__", fn),
        entry.factory,
        entry.final,
    )


def tool_names() -> list[str]:
    """Registered tool names, sorted."""
    return sorted(_TOOLS)


def build_tool(
    name: str, options: dict[str, Any] | None = None, *, timeout_s: float | None = None
) -> Tool:
    """The tool registered as ``name``, built with ``options``; ValueError names a bad one.

    ``timeout_s`` is the default of the ``timeout_s`` option; a factory that takes no
    such option gets it on the callable it returns (a :class:`Tool` it returns keeps its own).
    """
    if name not in _TOOLS:
        raise ValueError(f"unknown tool {name!r}; known: {', '.join(tool_names())}")
    entry = _TOOLS[name]
    opts = dict(options or {})
    default = opts.get("timeout_s", 10.0 if timeout_s is None else timeout_s)
    if not entry.factory:
        unknown = sorted(set(opts) - {"timeout_s"})
        if unknown:
            raise ValueError(
                f"tool {name!r}: unknown option {unknown[0]!r} (it takes only timeout_s)"
            )
        return Tool(entry.fn, name=name, final=entry.final, timeout_s=default)
    signature = inspect.signature(entry.fn)
    takes_timeout = "timeout_s" in signature.parameters or any(
        p.kind is p.VAR_KEYWORD for p in signature.parameters.values()
    )
    if timeout_s is not None and takes_timeout:
        opts.setdefault("timeout_s", timeout_s)
    try:
        signature.bind(**opts)
    except TypeError as exc:
        raise ValueError(f"tool {name!r}: bad options: {exc}") from None
    built = entry.fn(**opts)
    if not isinstance(built, Tool):
        return Tool(built, name=name, final=entry.final, timeout_s=default)
    if built.name != name:
        built = Tool(built.fn, name=name, timeout_s=built.timeout_s, final=built.final)
    return built


def build_tools(
    names: Sequence[str],
    options: dict[str, dict[str, Any]] | None = None,
    *,
    timeout_s: float | None = None,
) -> ToolSet:
    """A :class:`ToolSet` of registered tools, with per-tool ``options``.

    ``timeout_s`` is every tool's default ``timeout_s`` option (a tool's own option wins).
    Options for a tool that is not in ``names`` are an error (a typo would be ignored).
    """
    options = dict(options or {})
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(
            f"options for tool {stray[0]!r}, which is not among the tools {list(names)}"
        )
    return ToolSet([build_tool(n, options.get(n), timeout_s=timeout_s) for n in names])

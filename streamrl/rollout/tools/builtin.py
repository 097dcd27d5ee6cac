"""The built-in tools, registered by name: ``calculator``, ``search``, ``python``, ``final_answer``.

``build_tools(["calculator", "final_answer"])`` gives them to an episode; options per tool
(``{"search": {"corpus": "docs.jsonl"}, "python": {"timeout_s": 5}}``) are described on
each factory. Their docstrings are what the model reads in the tool schemas, so they
say what to pass, briefly.

>>> import asyncio
>>> from streamrl.rollout.tools import ToolCall, build_tools
>>> tools = build_tools(["calculator", "final_answer"])
>>> asyncio.run(tools.execute(ToolCall("calculator", {"expression": "1234*5678"}, ""))).content
'7006652'
>>> result = asyncio.run(tools.execute(ToolCall("final_answer", {"answer": "42"}, "")))
>>> result.content, result.final
('42', True)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from streamrl.rollout.tools.base import Tool, ToolFailure, ToolOutput
from streamrl.rollout.tools.calculator import calculate
from streamrl.rollout.tools.registry import register_tool
from streamrl.rollout.tools.search import search_tool

if TYPE_CHECKING:
    from streamrl.rollout.sandbox import SandboxResult

log = logging.getLogger(__name__)


@register_tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic to evaluate, for example "12*34" or "(7-2)/4"
    """
    return calculate(expression)


@register_tool("final_answer", final=True)
def final_answer(answer: str) -> str:
    """Give your final answer; this ends the conversation.

    Args:
        answer: the final answer, as short as possible
    """
    return answer


register_tool("search", factory=True)(search_tool)

# The sandbox gets the program's time limit; the tool's own limit, a backstop for a sandbox
# that does not return, is this much longer so that the sandbox's "timeout" comes first.
SANDBOX_GRACE_S = 5.0


@register_tool("python", factory=True)
def python_tool(timeout_s: float = 10.0, max_chars: int = 2000, **sandbox_options: Any) -> Tool:
    """The ``python`` tool: runs the code in ``streamrl.rollout.sandbox.Sandbox``.

    ``timeout_s`` is the program's limit in the sandbox; other options go to ``Sandbox``
    (``isolation: weak`` is the explicit opt-in to rlimits only; ``cgroup: required``
    makes a run without a cgroup an error). The observation is stdout (``"(no output)"``
    when empty); a failed program is a ``tool_error`` showing its exit code and the last
    ``max_chars`` of its output and stderr, a program past its limit a ``timeout``, a
    sandbox that cannot start a ``sandbox_error``. Each result's metadata says how the
    code was isolated (``sandbox_metadata``). A sandbox is made per call; one is made
    here first so that bad options fail when the tools are built.
    """
    from streamrl.rollout.sandbox import (  # lazily: only episodes that run code
        Sandbox,
        SandboxError,
    )

    try:
        Sandbox(timeout_s=timeout_s, **sandbox_options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool 'python': bad options: {exc}") from None

    async def python(code: str) -> ToolOutput:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: the program; print() the values you want to see
        """
        try:
            result = await Sandbox(timeout_s=timeout_s, **sandbox_options).arun(code)
        except SandboxError as exc:
            if str(exc) not in _LOGGED:
                _LOGGED.add(str(exc))
                log.warning("python tool: the sandbox could not start: %s", exc)
            message = f"the sandbox could not run the program: {exc}"
            raise ToolFailure("sandbox_error", message) from None
        metadata = sandbox_metadata(result)
        try:
            return ToolOutput(sandbox_observation(result, timeout_s, max_chars), metadata)
        except ToolFailure as failure:
            failure.metadata = metadata
            raise

    return Tool(python, timeout_s=timeout_s + SANDBOX_GRACE_S)


_LOGGED: set[str] = set()  # sandbox errors already logged (each is also counted)
_LIMIT_NAMES = {"memory": "the memory limit", "cpu_time": "the CPU time limit"}


def sandbox_metadata(result: SandboxResult) -> dict[str, Any]:
    """How a ``SandboxResult``'s code was isolated, for ``ToolResult.metadata``: the
    level (``strong: bwrap+seccomp+cgroup-v1``), the details, and counters for the
    episode's metrics (``sandbox/calls``, ``sandbox/weak_calls``,
    ``sandbox/no_cgroup_calls``).

    >>> from streamrl.rollout.sandbox import SandboxResult as R
    >>> m = sandbox_metadata(R(status="ok", exit_code=0, stdout="", stderr="", truncated=False,
    ...                        isolation="weak", wall_s=0.1, mechanism="rlimits"))
    >>> m["isolation"], m["metrics"]
    ('weak: rlimits+no-cgroup', {'sandbox/calls': 1.0, 'sandbox/weak_calls': 1.0, \
'sandbox/no_cgroup_calls': 1.0})
    """
    keys = ("isolation", "mechanism", "seccomp", "cgroup", "enforced", "notes", "usage", "limit")
    details = {k: getattr(result, k) for k in keys}  # (its declared fields, by name)
    return {
        "isolation": result.level,
        "sandbox": details,
        "metrics": {
            "sandbox/calls": 1.0,
            "sandbox/weak_calls": float(result.isolation != "strong"),
            "sandbox/no_cgroup_calls": float(result.cgroup is None),
        },
    }


def sandbox_observation(result: SandboxResult, timeout_s: float, max_chars: int = 2000) -> str:
    """A ``SandboxResult`` as the model's observation; raises ToolFailure when not ok.

    >>> from streamrl.rollout.sandbox import SandboxResult as R
    >>> sandbox_observation(R(status="ok", stdout="4\\n", stderr="", exit_code=0,
    ...                       truncated=False, isolation="strong", wall_s=0.1), 5.0)
    '4\\n'
    >>> sandbox_observation(R(status="error", stdout="", stderr="NameError: x\\n",
    ...                       exit_code=1, truncated=False, isolation="strong", wall_s=0.1), 5.0)
    Traceback (most recent call last):
    ...
    streamrl.rollout.tools.base.ToolFailure: the program failed (exit code 1):
    NameError: x
    """
    stdout, stderr = result.stdout or "", result.stderr or ""
    note = " (output truncated)" if result.truncated else ""
    if result.status == "ok":
        return _tail(stdout, max_chars) + note if stdout else f"(no output){note}"
    output = _tail(stdout + stderr, max_chars).rstrip()
    shown = f":\n{output}" if output else ""
    if result.status == "timeout":
        raise ToolFailure("timeout", f"the program ran past {timeout_s:g}s{note}{shown}")
    if result.status == "killed":
        limit = _LIMIT_NAMES.get(result.limit or "", "a resource limit")
        raise ToolFailure("tool_error", f"the program was killed ({limit}){note}{shown}")
    code = result.exit_code
    raise ToolFailure("tool_error", f"the program failed (exit code {code}){note}{shown}")


def _tail(text: str, limit: int) -> str:
    """The last ``limit`` characters (a traceback's end is what matters).

    >>> _tail("abcdef", 4)
    '…def'
    """
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]

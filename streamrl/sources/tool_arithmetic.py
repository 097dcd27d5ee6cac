"""Arithmetic for tool-using agents: problems a small model cannot compute in its head.

Like :class:`~streamrl.sources.arithmetic.ArithmeticTaskSource` (default: 4-digit
multiplication), but each item also carries ``metadata["demonstration"]``, the
assistant turns of a teacher trace for supervised warm-start: for a ``tool_fraction``
share of problems (chosen by a stable hash of the problem, so the split does not
depend on the seed) the teacher calls the calculator and then answers with its
result; for the rest it answers at once. RL then has something to learn: answering at
once is almost always wrong, calling the tool is right.

>>> src = ToolArithmeticTaskSource(digits=2, tool_fraction=1.0)
>>> item = next(src.train_iter(0))
>>> item.metadata["demonstration"][0].startswith("[calculator(expression=")
True
"""

from __future__ import annotations

import json
from typing import Literal

from streamrl.core.types import Item
from streamrl.sources.arithmetic import ArithmeticTaskSource
from streamrl.sources.base import stable_hash


def tool_call_text(expression: str, fmt: str, tool: str = "calculator") -> str:
    """The teacher's call as the model writes it in ``fmt`` (see streamrl.rollout.tools.parsers):
    the calculator on the expression, or python printing it."""
    name, key, value = (
        ("calculator", "expression", expression)
        if tool == "calculator"
        else ("python", "code", f"print({expression})")
    )
    if fmt == "pythonic":
        return f"[{name}({key}={json.dumps(value)})]"
    return "<tool_call>" + json.dumps({"name": name, "arguments": {key: value}}) + "</tool_call>"


class ToolArithmeticTaskSource(ArithmeticTaskSource):
    """Args: those of the arithmetic source, and
    tool_fraction: share of demonstrations that use the calculator.
    tool_format: how the teacher writes the call ('pythonic' or 'hermes').
    tool: the tool the teacher calls ('calculator', or 'python' running print(expression)).
    """

    task_name = "tool_arithmetic"

    def __init__(
        self,
        digits: int = 4,
        operators: str = "*",
        tool_fraction: float = 0.5,
        tool_format: Literal["pythonic", "hermes"] = "pythonic",
        tool: Literal["calculator", "python"] = "calculator",
        **kwargs,
    ) -> None:
        super().__init__(digits=digits, operators=operators, **kwargs)
        if not 0.0 <= tool_fraction <= 1.0:
            raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
        if tool_format not in ("pythonic", "hermes"):
            raise ValueError(f"tool_format must be 'pythonic' or 'hermes', got {tool_format!r}")
        if tool not in ("calculator", "python"):
            raise ValueError(f"tool must be 'calculator' or 'python', got {tool!r}")
        self.tool_fraction, self.tool_format, self.tool = tool_fraction, tool_format, tool

    def make_item(self, operands: list[int], operators: list[str]) -> Item:
        item = super().make_item(operands, operators)
        expr = item.metadata["expression"]
        uses_tool = stable_hash(f"tool:{expr}") < self.tool_fraction * 2.0**64
        turns = [tool_call_text(expr, self.tool_format, self.tool)] if uses_tool else []
        item.metadata["demonstration"] = [*turns, item.answer]
        return item

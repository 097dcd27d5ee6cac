"""Tools for multi-turn agent episodes: typed functions, call parsers, safe execution.

A tool is a plain typed Python function with a Google-style docstring (``Args:``); its
JSON schema comes from ``transformers.utils.get_json_schema`` and reaches the model
through ``tokenizer.apply_chat_template(messages, tools=toolset.schemas)``. An episode
parses a generated turn with ``get_tool_parser(name)`` (``hermes`` or ``pythonic``) and
runs each call, parsed or not, with ``await toolset.execute(call)``, which never raises
for the model's or the tool's failures: ``ToolResult.error`` names the kind
(``ERROR_KINDS``) and ``content`` is what the model sees.

>>> import asyncio
>>> tools = build_tools(["calculator", "final_answer"])
>>> content, calls = get_tool_parser("pythonic")('[calculator(expression="2**10"), calc(x=1)]')
>>> [(r.content, r.error) for r in [asyncio.run(tools.execute(c)) for c in calls]]
[('1024', None), ("Error: unknown tool 'calc'; tools: calculator, final_answer", 'unknown_tool')]
"""

from streamrl.rollout.tools.base import (
    ERROR_KINDS,
    ParseError,
    Tool,
    ToolCall,
    ToolFailure,
    ToolOutput,
    ToolResult,
    ToolSet,
)
from streamrl.rollout.tools.builtin import (
    calculator,
    final_answer,
    python_tool,
    sandbox_observation,
)
from streamrl.rollout.tools.parsers import (
    get_tool_parser,
    hermes,
    pythonic,
    register_tool_parser,
    tool_parser_names,
)
from streamrl.rollout.tools.registry import build_tool, build_tools, register_tool, tool_names
from streamrl.rollout.tools.search import BM25Index, load_corpus, search_tool

__all__ = [
    "ERROR_KINDS",
    "BM25Index",
    "ParseError",
    "Tool",
    "ToolCall",
    "ToolFailure",
    "ToolOutput",
    "ToolResult",
    "ToolSet",
    "build_tool",
    "build_tools",
    "calculator",
    "final_answer",
    "get_tool_parser",
    "hermes",
    "load_corpus",
    "python_tool",
    "pythonic",
    "register_tool",
    "register_tool_parser",
    "sandbox_observation",
    "search_tool",
    "tool_names",
    "tool_parser_names",
]

"""Tools for agent episodes: schemas, the two call parsers on good and malformed text,
execution of every error kind, and the built-in tools (calculator, search, python,
final_answer)."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import inspect
import json
import re
import sys
import threading
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamrl.rollout.sandbox import SandboxResult as RealSandboxResult
from streamrl.rollout.tools import (
    ERROR_KINDS,
    ParseError,
    Tool,
    ToolCall,
    ToolFailure,
    ToolResult,
    ToolSet,
    build_tool,
    build_tools,
    get_tool_parser,
    register_tool,
    register_tool_parser,
    tool_names,
    tool_parser_names,
)
from streamrl.rollout.tools.calculator import calculate
from tests.paths import TESTS

MODULES = ["base", "validation", "parsers", "calculator", "search", "registry", "builtin"]


@pytest.mark.parametrize("name", MODULES + [""])
def test_doctests(name: str) -> None:
    module = importlib.import_module("streamrl.rollout.tools" + (f".{name}" if name else ""))
    result = doctest.testmod(module)
    assert result.failed == 0


def documented(fn: Any) -> Any:
    """Give a test tool the Google-style docstring its schema needs."""
    args = "".join(f"\n    {p}: the {p}" for p in inspect.signature(fn).parameters)
    fn.__doc__ = f"Test tool {fn.__name__}.\n\nArgs:{args}\n"
    return fn


def run(tools: ToolSet, call: ToolCall | ParseError) -> ToolResult:
    return asyncio.run(tools.execute(call))


def call(tools: ToolSet, name: str, arguments: dict[str, Any]) -> ToolResult:
    return run(tools, ToolCall(name, arguments, ""))


def typed(count: int, ratio: float, label: str, flag: bool = False) -> str:
    """A tool with one argument of each basic type.

    Args:
        count: how many
        ratio: a fraction
        label: a name
        flag: a switch
    """
    return f"{count}|{ratio}|{label}|{flag}"


# --- schemas ------------------------------------------------------------------------------
def test_schema_comes_from_the_signature_and_docstring() -> None:
    tool = Tool(typed)
    fn = tool.schema["function"]
    assert tool.name == fn["name"] == "typed"
    assert fn["description"] == "A tool with one argument of each basic type."
    props = fn["parameters"]["properties"]
    types_ = [(k, v["type"]) for k, v in props.items()]
    assert types_ == [
        ("count", "integer"),
        ("ratio", "number"),
        ("label", "string"),
        ("flag", "boolean"),
    ]
    assert props["count"]["description"] == "how many"
    assert fn["parameters"]["required"] == ["count", "ratio", "label"]
    assert Tool(typed, name="typed2").schema["function"]["name"] == "typed2"


def test_builtin_schemas_and_toolset_rules() -> None:
    tools = build_tools(["calculator", "final_answer"])
    assert tools.names == ["calculator", "final_answer"]
    calc = tools.schemas[0]["function"]
    assert calc["parameters"]["properties"]["expression"]["type"] == "string"
    assert calc["parameters"]["required"] == ["expression"]
    with pytest.raises(ValueError, match="two tools are named 'typed'"):
        ToolSet([typed, Tool(typed)])

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="undocumented"):
        Tool(undocumented)
    assert {"calculator", "search", "python", "final_answer"} <= set(tool_names())


# --- the hermes parser --------------------------------------------------------------------
def hermes_call(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_hermes_reads_several_calls_in_order_with_whitespace() -> None:
    text = (
        "First I compute.\n"
        + hermes_call("calculator", {"expression": "1+1"})
        + "\nthen\n"
        + '<tool_call>  {"name" :"search",\n  "arguments": {"query": "cats", "k": 2}}  </tool_call>'
        + '<tool_call>{"name": "final_answer", "parameters": {"answer": "2"}}</tool_call>'
    )
    content, calls = get_tool_parser("hermes")(text)
    assert content == "First I compute.\n\nthen"
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "1+1"}),
        ("search", {"query": "cats", "k": 2}),
        ("final_answer", {"answer": "2"}),
    ]
    assert all(isinstance(c, ToolCall) and c.issue is None for c in calls)
    assert calls[0].raw == hermes_call("calculator", {"expression": "1+1"})
    assert get_tool_parser("hermes")("no calls here ") == ("no calls here", [])


def test_hermes_malformed_calls_become_parse_errors_counted_by_kind() -> None:
    parse = get_tool_parser("hermes")
    text = "".join(
        [
            "<tool_call>{'name': 'calculator'}</tool_call>",  # single quotes
            "<tool_call>[1, 2]</tool_call>",
            '<tool_call>{"arguments": {}}</tool_call>',
            '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
            hermes_call("calculator", '{"expression": "1+1"}'),  # decodable: repaired
            hermes_call("calculator", "expression=1+1"),  # not decodable
            '<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>',
            '<tool_call>{"name": "calculator", "arguments": {"expr',  # cut off
        ]
    )
    content, calls = parse(text)
    assert content == ""
    kinds = [c.kind if isinstance(c, ParseError) else f"call:{c.issue}" for c in calls]
    assert " ".join(kinds) == (
        "invalid_json not_an_object missing_name not_an_object "
        "call:arguments_as_string arguments_as_string invalid_json unclosed_tag"
    )
    assert calls[4].arguments == {"expression": "1+1"}
    assert calls[5].name == "calculator" and "not a string" in calls[5].message
    assert all(
        isinstance(c, ParseError) and c.kind in ERROR_KINDS for c in calls if c is not calls[4]
    )
    assert calls[0].raw == "<tool_call>{'name': 'calculator'}</tool_call>"
    # an unclosed last call whose JSON is whole is read (generation stopped at the tag)
    content, calls = get_tool_parser("hermes")(
        'Sure. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n'
    )
    assert content == "Sure."
    assert isinstance(calls[0], ToolCall) and calls[0].arguments == {"expression": "2*3"}
    _, calls = get_tool_parser("hermes")('<tool_call>{"name": "f"}</tool_call>')
    assert calls == [ToolCall("f", {}, '<tool_call>{"name": "f"}</tool_call>')]


# --- the pythonic parser ------------------------------------------------------------------
def test_pythonic_reads_lists_of_calls_in_order() -> None:
    parse = get_tool_parser("pythonic")
    content, calls = parse(
        'Let me see. [calculator(expression="12*34"), search(query="a ] b (c)", k=2)] '
        "and [final_answer(answer='408'), f(xs=[1, 2.5, None], d={'a': True}, n=-3)]"
    )
    assert content == "Let me see.  and"
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "12*34"}),
        ("search", {"query": "a ] b (c)", "k": 2}),
        ("final_answer", {"answer": "408"}),
        ("f", {"xs": [1, 2.5, None], "d": {"a": True}, "n": -3}),
    ]
    assert calls[0].raw == 'calculator(expression="12*34")'
    assert parse("[1, 2] plain [text] f(x=1)") == ("[1, 2] plain [text] f(x=1)", [])
    assert parse("[f()]")[1] == [ToolCall("f", {}, "f()")]


def test_pythonic_malformed_calls_never_run_code(tmp_path: Path) -> None:
    parse = get_tool_parser("pythonic")
    marker = tmp_path / "never_run"
    texts = [
        "[f(x=)]",  # invalid_syntax
        '[f(x="a")(y=1)]',  # not_a_call: calling a call
        '[f(x=1), "text"]',  # the second element is not a call
        "[f(12)]",  # positional_argument
        "[f(x=y)]",  # not_a_literal: a name
        f"[f(x=__import__('os').system('touch {marker}'))]",  # not_a_literal, never run
        "[f(x=1+2j)]",  # literal_eval accepts complex, a JSON type check refuses it later
        "[f(**{'x': 1})]",  # not_a_literal
        "[f(x=[1, 2)]",  # mismatched brackets: invalid_syntax
        '[f(x="open',  # unclosed: invalid_syntax
    ]
    kinds = []
    for text in texts:
        content, calls = parse(text)
        assert len(calls) >= 1, text
        kinds += [c.kind if isinstance(c, ParseError) else "call" for c in calls]
    assert " ".join(kinds) == (
        "invalid_syntax not_a_call call not_a_call positional_argument "
        "not_a_literal not_a_literal call not_a_literal invalid_syntax invalid_syntax"
    )
    assert not marker.exists()
    assert Counter(kinds)["not_a_literal"] == 3


def test_parser_registry() -> None:
    assert {"hermes", "pythonic"} <= set(tool_parser_names())
    with pytest.raises(ValueError, match="unknown tool parser 'nope'"):
        get_tool_parser("nope")

    @register_tool_parser("test_lines")
    def lines(text: str) -> tuple[str, list[ToolCall | ParseError]]:
        return "", [ToolCall(line, {}, line) for line in text.splitlines()]

    assert get_tool_parser("test_lines")("a\nb")[1][1].name == "b"
    with pytest.raises(ValueError, match="already registered"):
        register_tool_parser("hermes")(lines)


# --- execution and its error kinds --------------------------------------------------------
def test_every_argument_error_kind() -> None:
    tools = ToolSet([typed])
    good = {"count": 2, "ratio": 0.5, "label": "x"}
    assert call(tools, "typed", good).content == "2|0.5|x|False"
    # an integral float passes as an integer, an integer as a number
    r = call(tools, "typed", {**good, "count": 3.0, "ratio": 1})
    assert (r.content, r.error) == ("3|1|x|False", None)
    cases = {
        "unknown_tool": ToolCall("typo", good, ""),
        "missing_argument": ToolCall("typed", {"count": 1, "ratio": 0.5}, ""),
        "extra_argument": ToolCall("typed", {**good, "colour": "red"}, ""),
    }
    bad_types = {"count": "2", "ratio": "0.5", "label": 3, "flag": "yes"}
    results = {kind: run(tools, call) for kind, call in cases.items()}
    for name, value in bad_types.items():
        results[f"bad_argument_type:{name}"] = call(tools, "typed", {**good, name: value})
    results["bad_argument_type:bool"] = call(tools, "typed", {**good, "count": True})
    for key, result in results.items():
        assert result.error == key.split(":")[0], (key, result)
        assert result.content.startswith("Error: ") and not result.final
        assert result.latency_s >= 0.0
    assert "tools: typed" in results["unknown_tool"].content
    assert "missing argument 'label' (a string)" in results["missing_argument"].content
    assert "unexpected argument 'colour'" in results["extra_argument"].content
    count_error = results["bad_argument_type:count"].content
    assert "'count' must be an integer, got the string '2'" in count_error
    assert "'flag' must be a boolean" in results["bad_argument_type:flag"].content


def test_parse_errors_and_repaired_calls_are_observations_counted_by_kind() -> None:
    tools = build_tools(["calculator"])
    _, calls = get_tool_parser("hermes")(
        hermes_call("calculator", '{"expression": "6*7"}')
        + "<tool_call>{oops}</tool_call>"
        + hermes_call("calculator", {"expression": "1/0"})
    )
    results = [run(tools, c) for c in calls]
    # a repaired call runs and is still counted
    assert (results[0].content, results[0].error) == ("42", "arguments_as_string")
    assert results[1].error == "invalid_json"
    assert results[1].content.startswith("Error: the tool call is not valid JSON")
    assert results[1].latency_s == 0.0
    assert results[2].error == "tool_error"
    counts = Counter(r.error for r in results)
    assert counts == {"arguments_as_string": 1, "invalid_json": 1, "tool_error": 1}


def test_a_raising_tool_is_a_tool_error_without_traceback() -> None:
    @documented
    def explode(x: int) -> int:
        raise KeyError(f"no key {x}")

    @documented
    def leave(x: int) -> int:
        raise SystemExit(x)

    @documented
    async def fail_async(x: int) -> int:
        await asyncio.sleep(0)
        raise RuntimeError("async boom\nsecond line")

    @documented
    def report(x: int) -> int:
        raise ToolFailure("timeout", "took too long upstream")

    tools = ToolSet([explode, leave, fail_async, report])
    r = call(tools, "explode", {"x": 3})
    assert (r.error, r.content) == ("tool_error", "Error: explode raised KeyError: 'no key 3'")
    assert call(tools, "leave", {"x": 1}).content == "Error: leave raised SystemExit: 1"
    r = call(tools, "fail_async", {"x": 0})
    assert r.content == "Error: fail_async raised RuntimeError: async boom second line"
    assert "Traceback" not in r.content
    r = call(tools, "report", {"x": 0})
    assert (r.error, r.content) == ("timeout", "Error: report: took too long upstream")


def test_timeouts_abandon_threads_cancel_coroutines_and_never_block_the_loop() -> None:
    release = threading.Event()
    cancelled = []

    @documented
    def hang(seconds: float) -> str:
        release.wait(seconds)
        return "woke"

    @documented
    async def sleepy(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "slept"

    tools = ToolSet([Tool(hang, timeout_s=0.3), Tool(sleepy, timeout_s=0.3)])

    async def scenario() -> list[ToolResult]:
        results = await asyncio.gather(
            tools.execute(ToolCall("hang", {"seconds": 60}, "")),
            tools.execute(ToolCall("sleepy", {"seconds": 60}, "")),
            tools.execute(ToolCall("hang", {"seconds": 0}, "")),
        )
        await asyncio.sleep(0.05)  # the cancelled coroutine runs its handler
        return list(results)

    start = time.monotonic()
    try:
        results = asyncio.run(scenario())
    finally:
        release.set()
    # a generous bound: nothing hung, and the 60 s waits did not block the event loop
    assert time.monotonic() - start < 20
    assert [r.error for r in results] == ["timeout", "timeout", None]
    assert results[0].content == "Error: hang: did not finish within 0.3s"
    assert results[2].content == "woke"
    assert cancelled == [True]


def test_results_keep_the_order_of_the_calls_in_a_turn() -> None:
    @documented
    async def slow_echo(text: str, delay: float) -> str:
        await asyncio.sleep(delay)
        return text

    tools = ToolSet([slow_echo, Tool(typed)])
    _, calls = get_tool_parser("pythonic")(
        '[slow_echo(text="a", delay=0.05), slow_echo(text="b", delay=0), '
        'typed(count=1, ratio=1.5, label="c"), nope(), slow_echo(text="d", delay=0.01)]'
    )

    async def both() -> tuple[list[ToolResult], list[ToolResult]]:
        sequential = [await tools.execute(c) for c in calls]
        concurrent = await asyncio.gather(*(tools.execute(c) for c in calls))
        return sequential, list(concurrent)

    for results in asyncio.run(both()):
        assert [r.name for r in results] == ["slow_echo", "slow_echo", "typed", "nope", "slow_echo"]
        assert [r.content for r in results if not r.error] == ["a", "b", "1|1.5|c|False", "d"]


# --- final answer and the registry --------------------------------------------------------
def test_final_answer_ends_the_episode() -> None:
    tools = build_tools(["calculator", "final_answer"])
    _, calls = get_tool_parser("hermes")(
        hermes_call("calculator", {"expression": "2+2"})
        + hermes_call("final_answer", {"answer": "4"})
    )
    results = [run(tools, c) for c in calls]
    assert [(r.content, r.final, r.error) for r in results] == [
        ("4", False, None),
        ("4", True, None),
    ]
    wrong = call(tools, "final_answer", {"answer": 4})
    assert (wrong.error, wrong.final) == ("bad_argument_type", False)
    missing = run(tools, ParseError("invalid_json", "bad", "<tool_call>", name="final_answer"))
    assert (missing.name, missing.final) == ("final_answer", False)


def test_build_tools_options_and_errors() -> None:
    tools = build_tools(
        ["calculator", "final_answer"], {"calculator": {"timeout_s": 2}}, timeout_s=4
    )
    assert [t.timeout_s for t in tools.tools.values()] == [2.0, 4.0]
    with pytest.raises(ValueError, match="unknown tool 'calc'; known: "):
        build_tools(["calc"])
    with pytest.raises(ValueError, match="tool 'calculator': unknown option 'digits'"):
        build_tools(["calculator"], {"calculator": {"digits": 3}})
    with pytest.raises(ValueError, match="options for tool 'search', which is not among"):
        build_tools(["calculator"], {"search": {"corpus": []}})
    with pytest.raises(ValueError, match="tool 'search': bad options"):
        build_tools(["search"], {"search": {"corpus": ["x"], "size": 3}})
    with pytest.raises(ValueError, match="tool 'search': bad options"):
        build_tools(["search"])  # no corpus

    @register_tool("test_scaled", factory=True)
    def scaled(factor: int = 2):
        @documented
        def multiply(x: int) -> int:
            return factor * x

        return multiply

    tool = build_tool("test_scaled", {"factor": 5}, timeout_s=3)
    assert (tool.name, tool.timeout_s) == ("test_scaled", 3.0)
    assert run(ToolSet([tool]), ToolCall("test_scaled", {"x": 2}, "")).content == "10"
    with pytest.raises(ValueError, match="already registered"):
        register_tool("calculator")(typed)


# --- calculator ---------------------------------------------------------------------------
EXACT = [
    ("1234*5678", "7006652"),
    ("2 + 3 * 4", "14"),
    ("(2 + 3) * 4", "20"),
    ("-3 - -4", "1"),
    ("+5", "5"),
    ("7 / 2", "3.5"),
    ("6 / 3", "2"),
    ("1 / 3", "0.333333333333"),
    ("0.1 + 0.2", "0.3"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("17 % 5", "2"),
    ("2 ** 10", "1024"),
    ("2 ** -2", "0.25"),
    ("2 ** 0.5", "1.41421356237"),
    ("123456789 * 987654321", "121932631112635269"),
    ("1.5e3 * 2", "3000"),
    ("10 ** 30 + 1", "1000000000000000000000000000001"),
]
REFUSED = [
    ("__import__('os')", "function calls are not allowed"),
    ("__import__('os').system('true')", "function calls are not allowed"),
    ("(1).__class__", "attribute access is not allowed"),
    ("x + 1", "names are not allowed"),
    ("abs(-1)", "function calls are not allowed"),
    ("[1, 2][0]", "not allowed"),
    ("'a' * 3", "str values are not allowed"),
    ("1 < 2", "comparisons are not allowed"),
    ("True + 1", "bool values are not allowed"),
    ("lambda: 0", "lambdas are not allowed"),
    ("1 << 100", "the operator LShift is not allowed"),
    ("9**9**9", "would have about 369693100 digits (at most 1000)"),
    ("2**10000", "digits (at most 1000)"),
    ("(10**600) * (10**600)", "the result has more than 1000 digits"),
    ("10.0 ** 400", "the result is too large"),
    ("1e999", "the result is too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("1 +", "not an arithmetic expression"),
    ("", "the expression is empty"),
    ("1+" * 300 + "1", "longer than 500 characters"),
    ("(" * 240 + "1" + ")" * 240, "not an arithmetic expression"),
]


@pytest.mark.parametrize(("expression", "value"), EXACT)
def test_calculator_is_exact(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(("expression", "message"), REFUSED)
def test_calculator_refuses_clearly(expression: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match=re.escape(message)):
        calculate(expression)
    assert time.monotonic() - start < 5  # refused before paying for it


# --- search -------------------------------------------------------------------------------

CORPUS = [
    {"id": "paris", "text": "Paris is the capital and largest city of France."},
    {"id": "berlin", "text": "Berlin is the capital of Germany, on the river Spree."},
    {"id": "cats", "text": "Cats are small domesticated carnivores that sleep a lot."},
    {"id": "seine", "text": "The Seine flows through Paris before reaching the sea."},
]


def test_search_ranks_passages_with_bm25(tmp_path: Path) -> None:
    tools = build_tools(["search"], {"search": {"corpus": CORPUS}})

    def ids(query: str, k: int = 3) -> list[str]:
        r = call(tools, "search", {"query": query, "k": k})
        assert r.error is None, r
        return [line.split("]")[0][1:] for line in r.content.splitlines()]

    assert ids("capital of France") == ["paris", "berlin"]  # "capital" also matches Berlin
    assert ids("Paris France", k=1) == ["paris"]
    assert sorted(ids("paris", k=10)) == ["paris", "seine"]  # only passages that match
    assert ids("domesticated cats") == ["cats"]
    r = call(tools, "search", {"query": "quantum chromodynamics"})
    assert r.content == "no passage matches 'quantum chromodynamics'"
    assert call(tools, "search", {"query": "x", "k": 0}).error == "tool_error"
    first = call(tools, "search", {"query": "Seine"}).content
    assert first == "[seine] The Seine flows through Paris before reaching the sea."

    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in CORPUS) + "\n\n")
    from_file = build_tools(["search"], {"search": {"corpus": str(path), "max_chars": 12}})
    r = call(from_file, "search", {"query": "Germany"})
    assert r.content == "[berlin] Berlin is t…"  # 12 characters

    path.write_text('{"id": "a", "text": "fine"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"docs.jsonl:2: expected"):
        build_tools(["search"], {"search": {"corpus": str(path)}})
    with pytest.raises(ValueError, match="missing.jsonl"):
        build_tools(["search"], {"search": {"corpus": str(tmp_path / "missing.jsonl")}})
    with pytest.raises(ValueError, match="empty"):
        build_tools(["search"], {"search": {"corpus": []}})


# --- python (the sandbox) -----------------------------------------------------------------
def fake_sandbox(outcomes: dict[str, dict[str, Any]]) -> types.ModuleType:
    """A stand-in ``streamrl.rollout.sandbox`` whose ``arun(code)`` returns ``outcomes[code]``
    (as a real ``SandboxResult``: the tool reads its declared fields)."""
    module = types.ModuleType("streamrl.rollout.sandbox")

    SandboxResult = RealSandboxResult

    class Sandbox:
        made: list[dict[str, Any]] = []

        def __init__(self, timeout_s: float = 10.0, memory_mb: int = 512) -> None:
            Sandbox.made.append({"timeout_s": timeout_s, "memory_mb": memory_mb})

        async def arun(self, code: str) -> SandboxResult:
            base = {"exit_code": 0, "stdout": "", "stderr": "", "truncated": False}
            fake = {"isolation": "fake", "mechanism": "fake", "wall_s": 0.0}
            return SandboxResult(**{**base, **fake, **outcomes[code]})

    class SandboxError(RuntimeError):
        pass

    module.Sandbox, module.SandboxResult, module.SandboxError = Sandbox, SandboxResult, SandboxError
    return module


OUTCOMES = {  # code -> the SandboxResult fields the fake sandbox returns for it
    "print(2+2)": {"status": "ok", "stdout": "4\n"},
    "x = 1": {"status": "ok"},
    "1/0": {"status": "error", "exit_code": 1, "stderr": "Traceback ...\nZeroDivisionError: 0\n"},
    "while True: pass": {"status": "timeout", "exit_code": -9, "stdout": "partial\n"},
    "big": {"status": "killed", "exit_code": -9, "truncated": True},
    "oom": {"status": "killed", "exit_code": -9, "limit": "memory"},
}


def test_python_tool_maps_sandbox_results(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = fake_sandbox(OUTCOMES)
    monkeypatch.setitem(sys.modules, "streamrl.rollout.sandbox", sandbox)
    tools = build_tools(["python"], {"python": {"timeout_s": 2, "memory_mb": 64}})
    assert tools.tools["python"].timeout_s == 7.0  # the sandbox's limit comes first
    assert sandbox.Sandbox.made[0] == {"timeout_s": 2, "memory_mb": 64}
    results = {code: call(tools, "python", {"code": code}) for code in OUTCOMES}
    assert (results["print(2+2)"].content, results["print(2+2)"].error) == ("4\n", None)
    assert results["x = 1"].content == "(no output)"
    r = results["1/0"]
    assert r.error == "tool_error"
    assert r.content.startswith("Error: python: the program failed (exit code 1):\n")
    assert r.content.endswith("ZeroDivisionError: 0")
    r = results["while True: pass"]
    assert (r.error, r.content) == ("timeout", "Error: python: the program ran past 2s:\npartial")
    assert results["big"].error == "tool_error"
    assert "killed" in results["big"].content and "truncated" in results["big"].content
    assert results["oom"].content == "Error: python: the program was killed (the memory limit)"
    for r in results.values():  # ok or not, each result says how the code was isolated
        assert r.metadata["isolation"] == "fake: fake+no-cgroup"  # SandboxResult.level
        assert r.metadata["sandbox"]["isolation"] == "fake"
        assert r.metadata["metrics"] == {
            "sandbox/calls": 1.0,
            "sandbox/weak_calls": 1.0,  # "fake" is not strong
            "sandbox/no_cgroup_calls": 1.0,
        }
    with pytest.raises(ValueError, match="bad options"):
        build_tools(["python"], {"python": {"memory": 64}})


def test_python_tool_runs_in_the_real_sandbox() -> None:
    from tests.sandbox_corpus import require_strong

    require_strong()  # skips, naming why, where the strong sandbox cannot run
    tools = build_tools(["python"], {"python": {"timeout_s": 5}})
    ok = call(tools, "python", {"code": "print(6*7)"})
    assert (ok.content.strip(), ok.error) == ("42", None)
    assert ok.metadata["isolation"].startswith("strong: bwrap+seccomp")
    assert ok.metadata["sandbox"]["isolation"] == "strong"
    assert set(ok.metadata["sandbox"]["enforced"]) == {"memory", "processes", "cpu"}
    assert ok.metadata["metrics"]["sandbox/weak_calls"] == 0.0
    bad = call(tools, "python", {"code": "raise ValueError('nope')"})
    assert bad.error == "tool_error" and "ValueError: nope" in bad.content
    assert bad.metadata["isolation"] == ok.metadata["isolation"]
    start = time.monotonic()
    slow = build_tools(["python"], {"python": {"timeout_s": 1}})
    hung = call(slow, "python", {"code": "while True: pass"})
    assert hung.error == "timeout"
    assert time.monotonic() - start < 30


# --- the chat template --------------------------------------------------------------------
def test_schemas_render_and_template_calls_parse_back() -> None:
    """The Qwen-style template shows the schemas, and the calls it writes parse back."""
    from transformers import AutoTokenizer

    fixture = TESTS / "fixtures" / "qwen_style_tokenizer"
    if not fixture.is_dir():
        pytest.skip("no tests/fixtures/qwen_style_tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(fixture)
    tools = build_tools(["calculator", "final_answer"])
    calls = [("calculator", {"expression": "12*34"}), ("final_answer", {"answer": "408"})]
    written = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    turn = {"role": "assistant", "content": "Computing.", "tool_calls": written}
    messages = [{"role": "user", "content": "What is 12*34?"}, turn]
    text = tokenizer.apply_chat_template(messages, tools=tools.schemas, tokenize=False)
    assert json.dumps(tools.schemas[0]) in text
    turn = text.split("<|im_start|>assistant\n")[-1].split("<|im_end|>")[0]
    content, parsed = get_tool_parser("hermes")(turn)
    assert content == "Computing."
    assert [(c.name, c.arguments) for c in parsed] == calls

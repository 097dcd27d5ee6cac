"""``unit_tests``: run the completion's code against the item's tests in the sandbox.

The item carries its tests in ``metadata["tests"]`` (``[{"args": [...], "expected":
...}]``, JSON data; the ``code`` task source makes them, hidden from the prompt) and the
function's name in ``metadata["entry_point"]`` (and, when the completion continues a
prompt of code, that code in ``metadata["prefix"]``). One sandbox run per completion
(:mod:`streamrl.rollout.sandbox`, strong isolation unless ``isolation: weak`` is asked
for) runs :mod:`streamrl.rollout.rewards.code_harness`, which calls the function on each
test's arguments with its own timeout and reports every result as JSON.

The reward is the fraction of tests passed (``mode="fraction"``) or 1 only when all pass
(``mode="all"``). What happened is in the sample's metadata (``reward_reports
["unit_tests"]``: the status, passed and total, each test's status and time, the
isolation) and in the step's metrics (``unit_tests/<status>`` per answer, and
``unit_tests/test_timeouts``). Code that does not parse, fails to load, hangs or has no
such function scores 0 and is counted under its status; a sandbox that cannot run, or a
harness that ends without its report, is the reward's failure (counted as every
reward failure is).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

from streamrl.core.types import Item
from streamrl.rollout.rewards.guard import Scored
from streamrl.rollout.sandbox import Sandbox

FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
STATUSES = ("ok", "no_code", "syntax_error", "load_error", "load_timeout", "no_function")
HARNESS_MARGIN_S = 2.0  # the harness's own start-up and the workers' restarts


@cache
def harness_source() -> str:
    return Path(__file__).with_name("code_harness.py").read_text(encoding="utf-8")


def extract_code(completion: str, extract: str = "auto") -> str | None:
    """The code in ``completion``: ``fenced``, the last fenced block (``python`` or no
    language; an unclosed one runs to the end); ``whole``, the whole text; ``auto``, the
    fenced block if there is one, else the whole text. None when there is none.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> extract_code("def f(): return 1", "fenced") is None
    True
    """
    if extract not in ("auto", "fenced", "whole"):
        raise ValueError(f"extract must be 'auto', 'fenced' or 'whole', got {extract!r}")
    blocks = FENCE.findall(completion) if extract != "whole" else []
    code = blocks[-1] if blocks else (completion if extract != "fenced" else None)
    return code if code is not None and code.strip() else None


def item_tests(item: Item) -> tuple[str, list[dict[str, Any]]]:
    """The item's entry point and tests; ValueError (the reward's failure) when absent."""
    meta = item.metadata or {}
    entry, tests = meta.get("entry_point"), meta.get("tests")
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"item {item.id!r} has no metadata['entry_point'] (the function name)")
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"item {item.id!r} has no metadata['tests']")
    for i, t in enumerate(tests):
        if not (isinstance(t, dict) and isinstance(t.get("args"), list) and "expected" in t):
            raise ValueError(f"item {item.id!r}: tests[{i}] is not {{'args': [...], 'expected'}}")
    return entry, tests


def unit_tests(
    completion: str,
    item: Item,
    mode: Literal["fraction", "all"] = "fraction",
    extract: Literal["auto", "fenced", "whole"] = "auto",
    prefix: str = "",
    test_timeout_s: float = 1.0,
    load_timeout_s: float = 2.0,
    memory_mb: int = 256,
    isolation: Literal["strong", "weak"] = "strong",
) -> Scored:
    """The share of ``item``'s tests the completion's code passes (``mode="all"``: 1.0
    only when every one passes), with the per-test results (see the module docstring).

    ``prefix`` goes before the extracted code (e.g. imports the prompt promised), then
    the item's ``metadata["prefix"]`` (a prompt the completion continues);
    ``test_timeout_s`` bounds each test, ``load_timeout_s`` the code's loading, and the
    whole sandbox run gets their sum over the tests plus a margin.
    """
    entry, tests = item_tests(item)
    code = extract_code(completion, extract)
    if code is None:
        return _scored("no_code", "no code in the completion", [], len(tests), mode, "")
    spec = {
        "code": prefix + str(item.metadata.get("prefix", "")) + code,
        "entry_point": entry,
        "tests": tests,
        "test_timeout_s": test_timeout_s,
        "load_timeout_s": load_timeout_s,
    }
    budget = load_timeout_s + len(tests) * (test_timeout_s + load_timeout_s) + HARNESS_MARGIN_S
    sandbox = Sandbox(
        timeout_s=budget, cpu_s=budget, memory_mb=memory_mb, isolation=isolation, cpus=1.0
    )
    result = sandbox.run(harness_source(), stdin=json.dumps(spec))
    report = _report(result.stdout, len(tests))
    if report is None:
        if result.status in ("timeout", "killed"):  # the code stopped or killed the harness
            status = "sandbox_timeout" if result.status == "timeout" else "killed"
            return _scored(status, f"sandbox {result.status}", [], len(tests), mode, result.level)
        raise RuntimeError(
            f"the test harness ended {result.status} (exit {result.exit_code}) without a "
            f"report: {(result.stderr or result.stdout).strip()[-300:]}"
        )
    return _scored(
        report["status"], report.get("error", ""), report["tests"], len(tests), mode, result.level
    )


def _report(stdout: str, n: int) -> dict | None:
    """The harness's report (its last line), if it is one for ``n`` tests."""
    lines = stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    ok = isinstance(report, dict) and isinstance(report.get("tests"), list)
    return report if ok and len(report["tests"]) == n else None


def _scored(
    status: str, error: str, tests: list[dict], n: int, mode: str, isolation: str
) -> Scored:
    passed = sum(t.get("status") == "passed" for t in tests)
    value = passed / n if mode == "fraction" else float(passed == n)
    timeouts = sum(t.get("status") == "timeout" for t in tests)
    report = {
        "status": status,
        "error": error,
        "passed": passed,
        "total": n,
        "tests": tests,
        "isolation": isolation,
    }
    metrics = {f"unit_tests/{status}": 1.0, "unit_tests/test_timeouts": float(timeouts)}
    return Scored(value, report, metrics)


def setup(options: dict[str, Any], load: bool) -> None:
    """Checks the options once, when the reward is built."""
    extract_code("", options.get("extract", "auto"))
    for key in ("test_timeout_s", "load_timeout_s"):
        if not float(options.get(key, 1.0)) > 0:
            raise ValueError(f"unit_tests: {key} must be > 0")

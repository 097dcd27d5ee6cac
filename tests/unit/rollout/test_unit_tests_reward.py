"""The ``unit_tests`` reward: hand-written completions against hand-written tests, run in
the strong sandbox (skipped, naming why, where this machine cannot run it)."""

from __future__ import annotations

import secrets
import socket

import pytest

from streamrl.core.types import Item
from streamrl.rollout.rewards import CompositeReward, Scored, get_reward
from streamrl.rollout.rewards import unit_tests as unit_tests_module
from streamrl.rollout.rewards.unit_tests import extract_code
from streamrl.rollout.sandbox import SandboxError
from tests.paths import ROOT
from tests.sandbox_corpus import require_strong

OUTSIDE = ROOT / ".pytest_cache"  # a host place the sandbox shows read-only, not hidden


@pytest.fixture(scope="module")
def strong():
    return require_strong()


def add_item(*pairs: tuple[list, object]) -> Item:
    tests = [{"args": a, "expected": e} for a, e in pairs]
    return Item(id="add", prompt="p", metadata={"entry_point": "add", "tests": tests})


THREE = add_item(([1, 2], 3), ([2, 2], 4), ([0, 5], 5))


def score(completion: str, item: Item = THREE, **options) -> Scored:
    value = get_reward("unit_tests", **options)(completion, item)
    assert isinstance(value, Scored)
    return value


def statuses(s: Scored) -> list[str]:
    return [t["status"] for t in s.report["tests"]]


def test_correct_wrong_and_partial_by_fraction_and_all(strong):
    correct = "Sure:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    s = score(correct)
    assert (s.value, s.report["status"], s.report["passed"], s.report["total"]) == (
        1.0,
        "ok",
        3,
        3,
    )
    assert statuses(s) == ["passed"] * 3
    assert s.report["isolation"].startswith("strong: bwrap+seccomp")
    assert s.metrics == {"unit_tests/ok": 1.0, "unit_tests/test_timeouts": 0.0}
    # a * b is right only for (2, 2): one test of three
    partial = "def add(a, b):\n    return a * b\n"
    assert score(partial).value == pytest.approx(1 / 3)
    assert statuses(score(partial)) == ["failed", "passed", "failed"]
    assert score(partial, mode="all").value == 0.0
    assert score(correct, mode="all").value == 1.0
    wrong = "def add(a, b):\n    return 0\n"
    assert score(wrong).value == 0.0
    raises = "def add(a, b):\n    raise KeyError(a)\n"
    s = score(raises)
    assert s.value == 0.0 and statuses(s) == ["error"] * 3
    assert "KeyError" in s.report["tests"][0]["error"]


def test_code_that_cannot_run_scores_zero_and_is_counted(strong):
    cases = {
        "def add(a, b) return a": "syntax_error",
        "import no_such_module_xyz\ndef add(a, b):\n    return a + b\n": "load_error",
        "def plus(a, b):\n    return a + b\n": "no_function",
        "```python\n\n```": "no_code",
        "while True:\n    pass\n": "load_timeout",
    }
    for code, status in cases.items():
        s = score(code, load_timeout_s=0.5)
        assert (s.value, s.report["status"]) == (0.0, status), code
        assert s.metrics[f"unit_tests/{status}"] == 1.0
        assert s.report["error"]
        if status != "no_code":
            assert statuses(s) == ["not_run"] * 3


def test_a_hanging_test_times_out_alone(strong):
    # loops forever on (2, 2) only, catching what an alarm would raise: the harness kills
    # the worker at the test's timeout and a fresh one takes the remaining tests
    code = (
        "def add(a, b):\n    while a == 2:\n        try:\n            pass\n"
        "        except BaseException:\n            pass\n    return a + b\n"
    )
    s = score(code, test_timeout_s=0.5)
    assert statuses(s) == ["passed", "timeout", "passed"]
    assert s.value == pytest.approx(2 / 3)
    assert s.metrics["unit_tests/test_timeouts"] == 1.0
    assert s.report["tests"][1]["wall_s"] >= 0.5


def test_host_files_and_loopback_are_out_of_reach(strong, tmp_path):
    OUTSIDE.mkdir(exist_ok=True)
    secret = secrets.token_hex(8)
    files = [tmp_path / "secret.txt", OUTSIDE / f"secret-{secret}.txt"]
    for f in files:
        f.write_text(secret)
    try:
        # the read-only host filesystem shows OUTSIDE but not /tmp: the worker can read
        # OUTSIDE's file, proving the test would see a leak; tmp_path's it cannot
        item = Item(
            id="read",
            prompt="p",
            metadata={
                "entry_point": "read",
                "tests": [{"args": [str(files[0])], "expected": secret}],
            },
        )
        code = "def read(path):\n    return open(path).read()\n"
        s = score(code, item)
        assert (s.value, statuses(s)) == (0.0, ["error"])
        assert "FileNotFoundError" in s.report["tests"][0]["error"]
        item.metadata["tests"][0]["args"] = [str(files[1])]
        assert score(code, item).value == 1.0
    finally:
        files[1].unlink()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    try:
        port = listener.getsockname()[1]
        item = Item(
            id="net",
            prompt="p",
            metadata={"entry_point": "reach", "tests": [{"args": [port], "expected": "connected"}]},
        )
        code = (
            "import socket\ndef reach(port):\n"
            "    socket.create_connection(('127.0.0.1', port), timeout=0.5)\n"
            "    return 'connected'\n"
        )
        s = score(code, item)
        assert (s.value, statuses(s)) == (0.0, ["error"])
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_the_code_cannot_forge_the_report_or_see_the_expected_values(strong):
    forged = (
        '{"status": "ok", "error": "", "tests": '
        + str([{"status": "passed", "wall_s": 0, "error": ""}] * 3).replace("'", '"')
        + "}"
    )
    attempts = [
        # prints a passing report and exits before the tests run
        f"import os, sys\nprint({forged!r})\nsys.stdout.flush()\ndef add(a, b):\n"
        f"    os.write(1, b{forged!r} + b'\\n')\n    os._exit(0)\n",
        # an answer that equals anything
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Any()\n",
        # reads the harness's memory, stdin or environment through /proc
        "import os\ndef add(a, b):\n    for part in ('mem', 'fd/0', 'environ'):\n"
        "        try:\n            open(f'/proc/{os.getppid()}/{part}', 'rb').read(1)\n"
        "            return a + b\n        except OSError:\n            pass\n    return -1\n",
    ]
    for code in attempts:
        s = score(code)
        assert s.value == 0.0, (code, s.report)


def test_failures_of_the_reward_itself_are_counted(strong, monkeypatch):
    reward = CompositeReward([("unit_tests", 1.0)], timeout_s=30)
    try:
        ok = reward("def add(a, b):\n    return a + b\n", THREE)
        assert ok.total == 1.0 and ok.reports["unit_tests"]["passed"] == 3
        assert ok.metrics["unit_tests/ok"] == 1.0
        metadata = ok.record({"completion": "c", "metrics": {"agent/turns": 1.0}})
        assert metadata["reward_reports"]["unit_tests"]["status"] == "ok"
        assert metadata["metrics"] == {
            "agent/turns": 1.0,
            "unit_tests/ok": 1.0,
            "unit_tests/test_timeouts": 0.0,
        }
        missing = reward("def add(a, b):\n    return a + b\n", Item(id="x", prompt="p"))
        assert missing.total is None and "entry_point" in missing.errors["unit_tests"]

        class Broken:
            def __init__(self, **options):
                pass

            def run(self, code, stdin=""):
                raise SandboxError("no bwrap binary")

        monkeypatch.setattr(unit_tests_module, "Sandbox", Broken)
        failed = reward("def add(a, b):\n    return a + b\n", THREE)
        assert failed.total is None and "no bwrap binary" in failed.errors["unit_tests"]
        assert (reward.guard.calls, reward.guard.failures) == (3, 2)
    finally:
        reward.close()


def test_extraction_and_options():
    text = "a\n```python\nx = 1\n```\nb\n```\ny = 2\n```\n"
    assert extract_code(text) == "y = 2\n"
    assert extract_code(text, "whole") == text
    assert extract_code("plain code", "fenced") is None
    assert extract_code("plain code") == "plain code"
    assert extract_code("```python\nz = 3\n") == "z = 3\n"  # an unclosed block
    with pytest.raises(ValueError, match="extract"):
        CompositeReward([("unit_tests", 1.0, {"extract": "lines"})])
    with pytest.raises(ValueError, match="test_timeout_s"):
        CompositeReward([("unit_tests", 1.0, {"test_timeout_s": 0})])

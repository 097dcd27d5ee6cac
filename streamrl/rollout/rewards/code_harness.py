"""The test harness the ``unit_tests`` reward runs INSIDE the sandbox (as its main.py).

Standard library only: it is this file's text that runs, under ``python -I``, with the
spec on stdin: ``{"code", "entry_point", "tests": [{"args": [...], "expected": ...}],
"test_timeout_s", "load_timeout_s"}``. It prints one JSON line, the report:
``{"status": "ok" | "syntax_error" | "load_error" | "load_timeout" | "no_function",
"error": text, "tests": [{"status": "passed" | "failed" | "error" | "timeout" |
"crashed" | "not_run", "wall_s", "error"}]}``.

The completion's code never runs in this process: a worker process (a fresh
interpreter) loads it and calls the function on each test's arguments, one at a time,
and sends back the returned value as JSON. This process, which alone holds the expected
values (read from stdin, never on disk), compares them, and kills the worker when a test
runs past ``test_timeout_s`` (a fresh worker takes the remaining tests). It is made
non-dumpable first, so the worker (same uid) cannot read its memory, fds or environment
through /proc.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import select
import subprocess
import sys
import time

MAX_REPLY_BYTES = 1 << 20  # one test's returned value, as JSON
PR_SET_DUMPABLE = 4

# The worker: commands on a private copy of fd 0, replies on a private copy of fd 1;
# the code's own stdin, stdout and stderr are /dev/null.
WORKER = r"""
import json, os, sys, traceback
inp, out = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
def send(**reply):
    out.write(json.dumps(reply) + "\n")
    out.flush()
def text(e):
    return traceback.format_exception_only(type(e), e)[-1].strip()[:300]
spec = json.loads(inp.readline())
try:
    code = compile(spec["code"], "solution.py", "exec")
except (SyntaxError, ValueError) as e:
    send(status="syntax_error", error=text(e))
    sys.exit(0)
ns = {"__name__": "solution"}
try:
    exec(code, ns)
except BaseException as e:
    send(status="load_error", error=text(e))
    sys.exit(0)
fn = ns.get(spec["entry_point"])
if not callable(fn):
    send(status="no_function", error="no function " + repr(spec["entry_point"]))
    sys.exit(0)
send(status="ready")
for line in inp:
    try:
        value = fn(*json.loads(line))
    except BaseException as e:
        send(ok=False, error=text(e))
        continue
    try:
        reply = json.dumps({"ok": True, "value": value}, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as e:
        send(ok=False, error="returned a value that is not JSON data: " + text(e))
        continue
    out.write(reply + "\n")
    out.flush()
"""


def same(got: object, expected: object) -> bool:
    """Equal as data: bools only to bools, numbers by value (floats to 1e-9), lists and
    dicts item by item."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9) or got == expected
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


class Worker:
    """One worker process and its reply pipe."""

    def __init__(self, spec: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.buffer = b""
        first = {"code": spec["code"], "entry_point": spec["entry_point"]}
        self.send(first)

    def send(self, message: object) -> bool:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except OSError:  # it died
            return False

    def reply(self, timeout_s: float) -> dict | str:
        """The next reply, or "timeout", "crashed" (it ended), "too_large"."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_REPLY_BYTES:
                return "too_large"
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return "timeout"
            chunk = os.read(fd, 65536)
            if not chunk:
                return "crashed"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            return "crashed"
        return reply if isinstance(reply, dict) else "crashed"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_test(worker: Worker, test: dict, timeout_s: float) -> dict:
    """One test's result; the worker must be replaced unless it says "passed", "failed"
    or "error"."""
    start = time.monotonic()
    reply = worker.reply(timeout_s) if worker.send(test["args"]) else "crashed"
    wall = round(time.monotonic() - start, 4)
    if isinstance(reply, str):
        status = "crashed" if reply == "too_large" else reply
        error = {"timeout": f"ran past {timeout_s:g}s", "too_large": "reply too large"}
        return {"status": status, "wall_s": wall, "error": error.get(reply, "worker ended")}
    if not reply.get("ok"):
        return {"status": "error", "wall_s": wall, "error": str(reply.get("error", ""))}
    passed = same(reply.get("value"), test["expected"])
    return {"status": "passed" if passed else "failed", "wall_s": wall, "error": ""}


def start(spec: dict) -> tuple[Worker | None, str, str]:
    """A worker with the code loaded, or None and the load's status and error."""
    worker = Worker(spec)
    reply = worker.reply(float(spec["load_timeout_s"]))
    if isinstance(reply, dict) and reply.get("status") == "ready":
        return worker, "ok", ""
    worker.kill()
    if isinstance(reply, dict):
        return None, str(reply.get("status", "load_error")), str(reply.get("error", ""))
    if reply == "timeout":
        return None, "load_timeout", f"loading ran past {spec['load_timeout_s']:g}s"
    return None, "load_error", "the worker ended while loading the code"


def main() -> None:
    spec = json.loads(sys.stdin.read())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    tests, results = spec["tests"], []
    status, error, worker = "ok", "", None
    for test in tests:
        if worker is None:
            worker, status, error = start(spec)
            if worker is None:
                break
        result = run_test(worker, test, float(spec["test_timeout_s"]))
        results.append(result)
        if result["status"] in ("timeout", "crashed"):
            worker.kill()
            worker = None
    if worker is not None:
        worker.kill()
    results += [{"status": "not_run", "wall_s": 0.0, "error": error}] * (len(tests) - len(results))
    sys.stdout.write(json.dumps({"status": status, "error": error, "tests": results}) + "\n")


if __name__ == "__main__":
    main()

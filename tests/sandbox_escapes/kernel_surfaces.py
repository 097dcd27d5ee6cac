"""Reach the kernel surfaces escalation bugs live in, and undo the sandbox: nested
namespaces, mounts, io_uring, keyrings, bpf, perf events, userfaultfd, other
processes' memory (ptrace and process_vm_readv, on a child of our own), exotic socket
families, personality flags. Prints ``ESCAPED name`` for each call that succeeded.
Only calls harmless to the host are made (the program also runs in weak mode)."""

import ctypes
import os
import platform
import signal
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {  # x86_64, aarch64
    "unshare": (272, 97),
    "setns": (308, 268),
    "clone": (56, 220),
    "mount": (165, 40),
    "io_uring_setup": (425, 425),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "socket": (41, 198),
    "personality": (135, 92),
}
ARCH = 0 if platform.machine() == "x86_64" else 1
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x20000, 0x40000000


def call(label, name, *args, undo=None):
    result = libc.syscall(NR[name][ARCH], *args)
    if result < 0:
        print(f"blocked {label}: {os.strerror(ctypes.get_errno())}", flush=True)
        return
    print(f"ESCAPED {label} -> {result}", flush=True)
    if undo is not None:
        undo(result)


def in_child(fn):
    """Run ``fn`` in a child (namespace calls change the caller); wait for it."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


in_child(lambda: call("unshare(CLONE_NEWUSER)", "unshare", CLONE_NEWUSER))
in_child(lambda: call("unshare(CLONE_NEWNS)", "unshare", CLONE_NEWNS))
in_child(lambda: call("unshare(CLONE_NEWNET)", "unshare", CLONE_NEWNET))
fd = os.open("/proc/self/ns/user", os.O_RDONLY)
in_child(lambda: call("setns(own user namespace)", "setns", fd, 0))
os.close(fd)


def clone_user_namespace():
    pid = libc.syscall(NR["clone"][ARCH], CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:  # the raw clone's child
        os._exit(0)
    if pid < 0:
        print(f"blocked clone(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}", flush=True)
        return
    os.waitpid(pid, 0)
    print("ESCAPED clone(CLONE_NEWUSER)", flush=True)


in_child(clone_user_namespace)
# on a directory that does not exist: ENOENT where mount is allowed, EPERM where denied
call("mount(tmpfs)", "mount", b"none", b"/proc/streamrl-none", b"tmpfs", 0, 0)
params = ctypes.create_string_buffer(120)
call("io_uring_setup", "io_uring_setup", 4, params, undo=os.close)
call("keyctl(get session keyring)", "keyctl", 0, -3, 0)  # KEYCTL_GET_KEYRING_ID
call("add_key", "add_key", b"user", b"streamrl-escape", b"x", 1, -2)  # thread keyring
attr = ctypes.create_string_buffer(128)
call("bpf(BPF_MAP_CREATE)", "bpf", 0, attr, 128)
perf = ctypes.create_string_buffer(128)
ctypes.memmove(perf, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)  # software
call("perf_event_open", "perf_event_open", perf, 0, -1, -1, 0, undo=os.close)
call("userfaultfd", "userfaultfd", 0, undo=os.close)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)


def detach(_):
    os.waitpid(child, 0)  # the attach stops it
    libc.syscall(NR["ptrace"][ARCH], 17, child, 0, 0)  # PTRACE_DETACH


call("ptrace(PTRACE_ATTACH, own child)", "ptrace", 16, child, 0, 0, undo=detach)
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
remote = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
call("process_vm_readv(own child)", "process_vm_readv", child, local, 1, remote, 1, 0)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
for family, kind, label in (
    (17, 3, "AF_PACKET"),
    (38, 5, "AF_ALG"),
    (40, 1, "AF_VSOCK"),
    (4, 2, "AF_IPX"),
):
    call(f"socket({label})", "socket", family, kind, 0, undo=os.close)
in_child(lambda: call("personality(ADDR_NO_RANDOMIZE)", "personality", 0x0040000))
print("done", flush=True)

"""Make a mount namespace of our own (in a user namespace of our own unless we are
root), mount a tmpfs there (its pages belong to no process) and fill it."""

import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x10000000, 0x20000, 0x4000, 0x40000
uid, gid = os.getuid(), os.getgid()
if libc.unshare(CLONE_NEWNS if uid == 0 else CLONE_NEWUSER | CLONE_NEWNS) != 0:
    print(f"blocked unshare: {os.strerror(ctypes.get_errno())}", flush=True)
    raise SystemExit(0)
if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
# nothing we mount may propagate to the mount namespace we came from
if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    print(f"blocked making mounts private: {os.strerror(ctypes.get_errno())}", flush=True)
    raise SystemExit(0)
os.makedirs("hoard", exist_ok=True)
if libc.mount(b"none", b"hoard", b"tmpfs", 0, b"size=4g") != 0:
    print(f"blocked mount: {os.strerror(ctypes.get_errno())}", flush=True)
    raise SystemExit(0)
chunk = b"x" * (8 << 20)
for held in range(8, 4097, 8):
    with open(f"hoard/fill{held}", "wb", buffering=0) as f:  # each under the file size limit
        f.write(chunk)
    print(f"holding {held} MB", flush=True)
print("ESCAPED: held 4 GB in a private tmpfs", flush=True)

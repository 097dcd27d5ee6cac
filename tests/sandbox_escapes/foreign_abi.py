"""Make system calls through another ABI, where a filter written for the native one
would not look: i386's ``int 0x80`` and x32's numbers (x86_64 only). getpid each time:
``ESCAPED`` if it returned."""

import ctypes
import mmap
import platform

if platform.machine() != "x86_64":
    print("skipped: not x86_64")
    raise SystemExit(0)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
print("native getpid", libc.syscall(39), flush=True)
result = libc.syscall(0x40000000 + 39)  # x32 getpid: ENOSYS where the kernel lacks x32
print(f"x32 getpid returned {result}", flush=True)
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20 (getpid); int 0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
getpid32 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print(f"ESCAPED i386 getpid returned {getpid32()}", flush=True)

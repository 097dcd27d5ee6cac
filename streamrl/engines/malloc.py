"""Keep freed memory for reuse: glibc's malloc settings for training on the CPU.

By default glibc hands every block above its mmap threshold (128 KiB, raised on the fly
up to 32 MiB) to a fresh ``mmap`` and unmaps it on free, and it gives the top of its
heap back to the kernel once more than twice that threshold is free. A training update
allocates and frees its activations and gradients every time, so every update faults its
working set in again, page by page, each page zeroed by the kernel. On SmolLM2-135M
that was ~200,000 page faults and ~1 s of kernel time an update
(``benchmarks/bench_malloc.py``).

:func:`keep_freed_memory` fixes the mmap threshold at its 32 MiB maximum, raises the trim
threshold to 1 GiB and pads each heap growth by 256 MiB, so freed blocks stay in the
process and the next update reuses them. It changes nothing off glibc, or where the user
set glibc's malloc tunables (``GLIBC_TUNABLES``) themselves: theirs win.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
SETTINGS = {  # parameter: value
    M_MMAP_THRESHOLD: 32 << 20,  # glibc's maximum on 64-bit; larger blocks still use mmap
    M_TRIM_THRESHOLD: 1 << 30,
    M_TOP_PAD: 256 << 20,
}

_lock = threading.Lock()
_state: bool | None = None  # None: not tried yet in this process


def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS` once per process; True when they are in force."""
    global _state
    with _lock:
        if _state is None:
            _state = _apply()
        return _state


def _apply() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        log.info("GLIBC_TUNABLES sets malloc tunables: leaving them as they are")
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    failed = [param for param, value in SETTINGS.items() if libc.mallopt(param, value) != 1]
    if failed:  # mallopt returns 0 when it refuses a value
        log.warning("mallopt refused parameters %s; freed memory may go back to the kernel", failed)
    return not failed

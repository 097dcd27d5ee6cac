"""Hostile reward functions for the process-isolation tests (tests/unit/rollout/test_rewards.py).

They live in their own small module so that reward worker processes can import them by
name (``functools.partial`` and module-level functions pickle by reference).
"""

from __future__ import annotations

import ctypes
import os
import time

_LEAKED: list[bytes] = []  # grows on every leak() call in a worker, never freed


def segfault(completion: str, item: object) -> float:
    """Crash the interpreter (SIGSEGV): reads address 0."""
    ctypes.string_at(0)
    return 1.0


def leak(completion: str, item: object, mb: int = 64) -> float:
    """Keep ``mb`` more megabytes alive on every call; returns how many chunks are held."""
    _LEAKED.append(b"x" * (mb * 2**20))
    return float(len(_LEAKED))


def allocate_huge(completion: str, item: object) -> float:
    """Ask for far more memory than any worker limit allows."""
    return float(len(bytearray(64 * 2**30)))


def sleep_forever(completion: str, item: object) -> float:
    time.sleep(1000)
    return 1.0


def spin_forever(completion: str, item: object) -> float:
    while True:
        pass


def text(completion: str, item: object) -> str:
    """Not a number."""
    return "1.0"


def worker_pid(completion: str, item: object) -> float:
    """The process the reward runs in, to tell a replaced worker from the old one."""
    return float(os.getpid())

"""Running the sandbox's process under asyncio: stdin in, output kept under a byte
budget, the wall clock, and its process group killed on timeout, overflow or cancel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any


@dataclass
class Raw:
    """A finished process as the runner saw it (before it is read as a SandboxResult).
    ``set_up`` is False when the wall clock ran out before ``setup`` had finished."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    killed: bool  # by us, for its output
    wall_s: float
    set_up: bool = True


async def execute(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    stdin: bytes,
    pass_fds: list[int],
    timeout_s: float,
    max_output_bytes: int,
    setup: Coroutine[Any, Any, None] | None = None,
) -> Raw:
    """Spawn ``argv``, run ``setup`` (a handshake with it; what it raises is raised here,
    after the process is killed), feed stdin, collect output under the byte budget and
    the wall clock. ``pass_fds`` are the child's ends: closed here once it has them."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    transport, proto = await _spawn(loop, argv, env, cwd, pass_fds, max_output_bytes, setup)
    set_up = setup is None

    async def drive() -> None:
        nonlocal set_up
        if setup is not None:
            await setup
            set_up = True
        pipe = transport.get_pipe_transport(0)
        if stdin:
            pipe.write(stdin)
        pipe.close()
        await asyncio.shield(proto.finished)

    timed_out = False
    try:
        await asyncio.wait_for(drive(), timeout_s)
    except asyncio.TimeoutError:
        timed_out = transport.get_returncode() is None
    finally:
        if proto.kill():
            # see it reaped while our loop runs (else asyncio warns after the loop closed)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(proto.exited), 10)
        transport.close()
    return Raw(
        transport.get_returncode(),
        b"".join(proto.chunks[1]),
        b"".join(proto.chunks[2]),
        proto.truncated,
        timed_out,
        proto.killed,
        time.monotonic() - start,
        set_up,
    )


async def _spawn(
    loop: asyncio.AbstractEventLoop,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    pass_fds: list[int],
    max_output_bytes: int,
    setup: Coroutine[Any, Any, None] | None,
) -> tuple[asyncio.SubprocessTransport, _Collector]:
    """Start ``argv`` in its own process group with piped stdio; the child's ends of
    ``pass_fds`` are closed here either way, and ``setup`` is closed if it cannot start."""
    try:
        return await loop.subprocess_exec(
            lambda: _Collector(max_output_bytes, loop),
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            pass_fds=pass_fds,
            start_new_session=True,  # one process group to kill
        )
    except BaseException:
        if setup is not None:
            setup.close()
        raise
    finally:
        for fd in pass_fds:  # we must not hold the child's ends (EOF, no leaks)
            os.close(fd)


class _Collector(asyncio.SubprocessProtocol):
    """Keeps at most ``limit`` bytes of stdout + stderr; past that, kills the process."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self.limit = limit
        self.chunks: dict[int, list[bytes]] = {1: [], 2: []}
        self.kept = 0
        self.truncated = self.killed = False
        self.transport: Any = None  # asyncio.SubprocessTransport
        self.exited = loop.create_future()
        self.finished = loop.create_future()  # the process exited and its pipes closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        room = self.limit - self.kept
        if len(data) > room:
            data = data[:room]
            self.truncated = True
            self.killed = self.killed or self.kill()
        if data:
            self.chunks[fd].append(data)
            self.kept += len(data)

    def process_exited(self) -> None:
        # what the program left behind in its group (weak mode) would hold the pipes
        if self.transport is not None:
            killpg(self.transport.get_pid())
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def kill(self) -> bool:
        """SIGKILL the process group if the process still runs; True if it did."""
        if self.transport is None or self.transport.get_returncode() is not None:
            return False
        return killpg(self.transport.get_pid())


def killpg(pgid: int) -> bool:
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def read_available(fd: int) -> bytes:
    """What is in the pipe now (its writer has exited or been killed)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    return b"".join(chunks)

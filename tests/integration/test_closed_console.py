"""A run outlives its console: ``streamrl serve`` whose reader closed the pipe after the
first line keeps serving and stops on SIGTERM as it would otherwise (128 + 15, a
checkpoint, no BrokenPipeError in run.log)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.cli.console import ConsoleStream
from tests.paths import ROOT


class _Closed(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_console_that_is_gone_drops_writes() -> None:
    stream = ConsoleStream(_Closed())
    assert stream.write("step 1\n") == 7 and stream.gone
    stream.write("step 2\n")
    stream.flush()


@pytest.mark.slow
def test_serve_keeps_serving_after_its_reader_closed_the_pipe(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "serve", "run.name=hook"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert "serving http://127.0.0.1:" in proc.stdout.readline()
        proc.stdout.close()  # the reader is gone
        time.sleep(3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    log = (tmp_path / "runs" / "hook" / "run.log").read_text()
    assert "BrokenPipeError" not in log and "checkpoint" in log


def test_a_stream_closed_at_start_becomes_a_null_console(monkeypatch) -> None:
    from streamrl.cli.console import tolerate_a_closed_console

    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", None)
    tolerate_a_closed_console()
    assert isinstance(sys.stdout, ConsoleStream) and not sys.stdout.isatty()
    assert sys.stderr.write("dropped\n") == 8


@pytest.mark.slow
def test_serve_started_with_its_standard_streams_closed_keeps_serving(tmp_path: Path) -> None:
    """Some launchers start a daemon with descriptors 0-2 closed: Python then has no
    sys.stdout, and uvicorn's log formatter asked it isatty() (the run failed)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = f"exec {sys.executable} -m streamrl.cli.main serve run.name=hook 0<&- 1>&- 2>&-"
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=tmp_path, env=env)
    log = tmp_path / "runs" / "hook" / "run.log"
    try:
        deadline = time.monotonic() + 120
        while "endpoint listening" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, log.read_text() if log.exists() else "no run.log"
            assert time.monotonic() < deadline, "the endpoint never listened"
            time.sleep(0.2)
        time.sleep(3)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert "run failed" not in log.read_text()

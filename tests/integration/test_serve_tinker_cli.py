"""``streamrl serve --api tinker`` through the command line with its defaults: it prints
where it listens, the official client reaches it with the key it wrote, a LoRA client
trains one step on a served base, and SIGTERM ends it with exit status 0."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed")


@pytest.mark.slow
def test_serve_api_tinker_with_its_defaults(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "serve", "--api", "tinker"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    service = None
    try:
        seen = []
        for line in proc.stdout:  # until it says where it listens (or exits)
            seen.append(line)
            if url := re.search(r"Tinker API at (http://127\.0\.0\.1:\d+)", line):
                break
        assert url, "".join(seen)
        token = (tmp_path / "runs" / "tinker" / "tinker_token").read_text()
        service = tinker.ServiceClient(base_url=url.group(1), api_key=token)
        models = [m.model_name for m in service.get_server_capabilities().supported_models]
        assert any("tiny-small" in m for m in models), models
        base = next(m for m in models if "tiny-small" in m)
        training = service.create_lora_training_client(base_model=base, rank=2).result()
        tokenizer = training.get_tokenizer()
        ids = tokenizer.encode("12+30=42", add_special_tokens=False)
        datum = tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
        )
        out = training.forward_backward([datum], "cross_entropy").result()
        assert out.metrics and all(v == v for v in out.metrics.values())  # finite numbers
        training.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
    finally:
        with contextlib.suppress(Exception):  # the server is stopped below whatever happens
            if service is not None:
                service.close("success").result()  # its heartbeat must not outlive the server
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, proc.stdout.read()

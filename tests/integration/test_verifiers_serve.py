"""The other direction: a verifiers environment's own rollout code, with verifiers' own
OpenAI client, pointed at `streamrl serve` (examples/external_agent/verifiers_agent.py)
trains a run end to end: every session is consumed, the run completes."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest

from streamrl.run.launch import train
from tests.endpoint_harness import endpoint_cfg
from tests.paths import ROOT

pytest.importorskip("verifiers")


def _agent():
    path = ROOT / "examples" / "external_agent" / "verifiers_agent.py"
    spec = importlib.util.spec_from_file_location("verifiers_agent", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_verifiers_environment_trains_through_the_endpoint(tmp_path: Path) -> None:
    cfg = endpoint_cfg(tmp_path, "rollout.group_size=2", "stream.max_staleness=1")
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("result", train(cfg)), daemon=True)
    runner.start()
    args = {"digits": 1, "train_size": 16, "eval_size": 4}
    load = "streamrl.rollout.envs.vf_arithmetic:arithmetic_env"
    done, _ = asyncio.run(_agent().play(tmp_path / "served", load, args, 2, 4, 120.0))
    runner.join(300)
    s = out["result"].summary
    assert s["stream/consumed"] == 2 and done >= 2
    assert s["stream/issued"] == s["stream/consumed"] + s["stream/filtered"] + s["stream/failed"]

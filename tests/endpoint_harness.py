"""Shared set-up of the endpoint tests: a served run's config, a pool served on its own
(no trainer) over a scripted or a real engine, and raw HTTP over a socket."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrl.config import Config
from streamrl.core.types import GenerationResult
from streamrl.engines.inference.engine import EngineStats
from streamrl.models import load_model_and_tokenizer
from streamrl.run.assembly import rollout_spec
from streamrl.stream.endpoint.pool import EndpointPool
from streamrl.stream.sample_stream import SampleStream
from tests.tiny_run import tiny_rl_config


def endpoint_cfg(tmp_path: Path, *extra: str) -> Config:
    """A tiny served run: one item per step, 2 steps, eta = 0, 4 new tokens."""
    return tiny_rl_config(
        tmp_path,
        "train.items_per_step=1",
        "train.steps=2",
        "stream.max_staleness=0",
        "algorithm.name=reinforce_pp",
        "algorithm.dynamic_sampling=false",
        "rollout.max_new_tokens=4",
        "endpoint.enabled=true",
        "run.name=served",
        *extra,
    )


def wait_endpoint(run_dir: Path, runner: threading.Thread) -> tuple[str, str]:
    """(base_url, token) of the run serving in ``run_dir``, once it listens."""
    for _ in range(1200):
        if (run_dir / "endpoint.json").exists():
            info = json.loads((run_dir / "endpoint.json").read_text())
            return info["base_url"], Path(info["token_file"]).read_text()
        assert runner.is_alive(), "the run ended before serving"
        time.sleep(0.05)
    raise AssertionError("the endpoint did not start")


class ScriptedEngine:
    """Answers every request with the same text; records the requests it was given."""

    def __init__(self, tokenizer: Any, text: str = "4") -> None:
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.version, self.stats = 0, EngineStats()
        self.requests: list[Any] = []

    def update_weights(self, state_dict, version) -> None:
        self.version = version

    async def agenerate(self, request) -> GenerationResult:
        self.requests.append(request)
        n = len(self.ids)
        return GenerationResult(request.prompt_ids, self.ids, [-0.5] * n, [0] * n, "stop")

    def close(self) -> None:
        pass


@contextlib.contextmanager
def served(
    cfg: Config,
    run_dir: Path,
    *,
    engine: Any = None,
    tokenizer: Any = None,
    stream: SampleStream | None = None,
) -> Iterator[EndpointPool]:
    """An endpoint pool listening on loopback with no trainer behind it: ``engine`` (a
    :class:`ScriptedEngine` by default, or None with ``engine="real"``: the run's model
    in the built-in engine), over ``stream`` (default: 1 item per batch, eta = 0)."""
    model, tok = load_model_and_tokenizer(cfg.model.name_or_path)
    tokenizer = tokenizer or tok
    if engine is None:
        engine = ScriptedEngine(tok)
    real = engine == "real"
    stream = stream or SampleStream(1, 0)
    pool = EndpointPool(
        cfg.endpoint,
        rollout_spec(cfg),
        model.eval() if real else None,
        tokenizer,
        model.state_dict() if real else {},
        0,
        stream,
        run_dir,
        engine=None if real else engine,
    )
    pool.start()
    try:
        yield pool
    finally:
        pool.stop()
        stream.close()


def raw_http(pool: EndpointPool, request: bytes, *, timeout: float = 60.0) -> bytes:
    """Sends ``request`` as is and reads until the server closes the connection (a
    server that answers before reading the whole body may reset it once it has)."""
    host, port = pool.base_url.split("//")[1].split("/")[0].split(":")
    chunks: list[bytes] = []
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, BrokenPipeError):
            if not chunks:
                raise
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])

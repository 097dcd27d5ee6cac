"""Shared set-up of the Tinker service tests: the service on loopback over the tiny-small
preset, the official ``tinker`` client connected to it, and datums built by hand."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed")
from tinker import types  # noqa: E402

from streamrl.config.tinker import TinkerConfig  # noqa: E402
from streamrl.stream.endpoint.tinker.server import TinkerServer  # noqa: E402

os.environ.setdefault("TINKER_TELEMETRY", "0")


@contextlib.contextmanager
def tinker_server(state_dir: Path, **cfg) -> Iterator[TinkerServer]:
    config = TinkerConfig(models=["tiny-small"], state_dir=str(state_dir), **cfg)
    server = TinkerServer(config)
    server.start()
    _clients[id(server)] = []
    try:
        yield server
    finally:
        for service in _clients.pop(id(server)):  # their session heartbeats end here,
            service.close("success").result()  # not against a stopped server later
        server.stop()


#: the clients made for each running server, closed before it stops
_clients: dict[int, list[tinker.ServiceClient]] = {}


def client(server: TinkerServer, api_key: str | None = None) -> tinker.ServiceClient:
    service = tinker.ServiceClient(base_url=server.base_url, api_key=api_key or server.token)
    _clients.setdefault(id(server), []).append(service)
    return service


def base_name(server: TinkerServer) -> str:
    """The served model's name, as the capabilities list it (its checkpoint directory)."""
    caps = tinker.RestClient(base_url=server.base_url, api_key=server.token)
    return caps.get_server_capabilities().result().supported_models[0].model_name


def sft_datum(tokenizer, prompt: str, completion: str) -> types.Datum:
    """Next-token datum of prompt + completion, weight 1 on the completion's tokens."""
    p = tokenizer.encode(prompt, add_special_tokens=False)
    c = tokenizer.encode(completion, add_special_tokens=False)
    ids = p + c
    weights = [0.0] * (len(p) - 1) + [1.0] * len(c)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
    )

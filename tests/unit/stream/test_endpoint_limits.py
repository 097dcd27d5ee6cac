"""The endpoint's limits, over real HTTP: the token before anything else, body and prompt
size caps, header and body timeouts, no documentation routes, malformed headers, non-finite
numbers anywhere in a body, sampling parameters the sampler cannot take, chat templates
rendered off the event loop, and one call's engine failure failing that call alone."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from streamrl.core.types import GenerationResult
from streamrl.models import load_model_and_tokenizer
from streamrl.stream.endpoint.openai_format import ChatRequest, RewardRequest
from streamrl.stream.sample_stream import SampleStream
from tests.endpoint_harness import ScriptedEngine, endpoint_cfg, raw_http, served, status_of

LIMITS = (
    "endpoint.max_body_bytes=65536",
    "endpoint.max_prompt_tokens=64",
    "endpoint.header_timeout_s=1",
    "endpoint.read_timeout_s=1",
)
MSGS = [{"role": "user", "content": "1+2="}]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    with served(endpoint_cfg(tmp, *LIMITS), tmp, stream=SampleStream(64, 0)) as p:
        yield p


def _post(pool, path: str, content: bytes | str, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {pool.token}", "Content-Type": "application/json"}
    return httpx.post(f"{pool.base_url}{path}", content=content, headers={**auth, **headers})


def _chat(pool, **fields: Any) -> httpx.Response:
    return _post(pool, "/chat/completions", json.dumps({"messages": MSGS, **fields}))


def _request(pool, head: str, body: bytes = b"", token: bool = True) -> bytes:
    auth = f"Authorization: Bearer {pool.token}\r\n" if token else ""
    text = f"{head}\r\nHost: x\r\n{auth}Connection: close\r\n"
    return text.encode()


def test_the_token_is_checked_before_the_body_is_read(pool) -> None:
    # 50 MB announced, none sent: the answer comes at once and the connection closes
    for token in (False, True):
        head = _request(pool, "POST /v1/chat/completions HTTP/1.1", token=token)
        reply = raw_http(pool, head + b"Content-Length: 50000000\r\n\r\n" + b"{" * 1000)
        assert status_of(reply) == (413 if token else 401), reply
    # a chunked body over the cap: 413 as soon as the cap is passed
    head = _request(pool, "POST /v1/chat/completions HTTP/1.1")
    chunk = b"x" * 40000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    reply = raw_http(pool, head + b"Transfer-Encoding: chunked\r\n\r\n" + body)
    assert status_of(reply) == 413
    assert b"endpoint.max_body_bytes" in reply
    # under the cap it is served
    assert _chat(pool, max_tokens=2).status_code == 200


def test_malformed_headers_never_give_500(pool) -> None:
    good = f"Bearer {pool.token}".encode()
    wrong_auth = [
        b"Bearer \xff\xfe\xfd",  # not ASCII: compared as bytes, only a wrong token
        b"bearer " + pool.token.encode(),
        good + b"x",
        b"Bearer",
        b"Bearer " + b"a" * 10000,
        b"Bearer \x01" + pool.token.encode(),  # a control character
    ]
    for value in wrong_auth:
        req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
        status = status_of(raw_http(pool, req + b"Connection: close\r\n\r\n"))
        assert status == 401, value
    # two Authorization headers, even both right: 401
    req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + good
    req += b"\r\nAuthorization: " + good + b"\r\nConnection: close\r\n\r\n"
    assert status_of(raw_http(pool, req)) == 401
    # a session id header that is not ASCII is a session like any other; an empty or
    # too long one is a 422
    body = json.dumps({"messages": MSGS, "max_tokens": 1}).encode()
    for value, status in ((b"\xff\xfe", 200), (b"s" * 201, 422), (b"", 200)):
        head = _request(pool, "POST /v1/chat/completions HTTP/1.1")
        head += b"X-Session-Id: " + value + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        assert status_of(raw_http(pool, head + body)) == status, value
    # headers still incomplete past 16 KiB, a malformed Content-Length: the server's 400
    huge = _request(pool, "GET /v1/models HTTP/1.1") + b"X-Big: " + b"a" * 20000
    assert status_of(raw_http(pool, huge)) == 400
    bad_length = (
        _request(pool, "POST /v1/chat/completions HTTP/1.1") + b"Content-Length: 1x\r\n\r\n"
    )
    assert status_of(raw_http(pool, bad_length)) == 400


def test_no_documentation_routes(pool) -> None:
    auth = {"Authorization": f"Bearer {pool.token}"}
    root = pool.base_url.removesuffix("/v1")
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert httpx.get(root + path).status_code == 401
        assert httpx.get(root + path, headers=auth).status_code == 404


def test_slow_headers_close_the_connection_and_a_slow_body_gets_408(pool) -> None:
    host, port = pool.base_url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        assert s.recv(1024) == b""  # closed by the server (header_timeout_s = 1)
    head = _request(pool, "POST /v1/chat/completions HTTP/1.1")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head + b"Content-Length: 100\r\n\r\n" + b'{"messages": ')
        reply = s.recv(65536)
    assert status_of(reply) == 408


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_numbers_are_422_wherever_they_are(pool, number: str) -> None:
    msgs = json.dumps(MSGS)
    bodies = [
        f'{{"messages": {msgs}, "temperature": {number}}}',
        f'{{"messages": {msgs}, "top_p": {number}}}',
        f'{{"messages": {msgs}, "presence_penalty": {number}}}',
        f'{{"messages": {msgs}, "logit_bias": {{"5": {number}}}}}',  # a field we ignore
        f'{{"messages": [{{"role": "user", "content": "hi", "weight": {number}}}]}}',
    ]
    for body in bodies:
        r = _post(pool, "/chat/completions", body)
        assert r.status_code == 422, (body, r.text)
        assert "finite" in r.json()["error"]["message"]
    for body in (f'{{"reward": {number}}}', f'{{"rewards": [1.0, {number}]}}'):
        r = _post(pool, "/sessions/any/reward", body)
        assert r.status_code == 422, (body, r.text)
    # the models' own rule, for bodies built in Python
    with pytest.raises(ValidationError, match="finite"):
        ChatRequest.model_validate({"messages": MSGS, "temperature": float(number)})
    with pytest.raises(ValidationError, match="finite"):
        RewardRequest.model_validate({"rewards": [0.0, float(number)]})


def test_out_of_range_parameters_are_422_naming_the_field(pool) -> None:
    cases = {
        "temperature": [1e-300, 1e-40, 0.001, -1, 3],
        "top_p": [1e-300, 1e-39, 0, -0.5, 1.5],  # 1e-39: subnormal in float32
        "frequency_penalty": [0.5],
        "n": [0, 65],
        "max_tokens": [0],
        "stop": [["a", "b", "c", "d", "e"], [""], "x" * 300],
        "session_id": ["", "s" * 201],
    }
    for field, values in cases.items():
        for value in values:
            r = _chat(pool, **{field: value})
            assert r.status_code == 422, (field, value, r.text)
            assert r.json()["error"]["message"].startswith(field), r.text
    for bad in ({"reward": 1e10}, {"reward": 1, "rewards": [1]}, {}, {"rewards": "x"}):
        assert _post(pool, "/sessions/any/reward", json.dumps(bad)).status_code == 422, bad
    for body in (b"{", b"[" * 5000 + b"]" * 5000, b"\xff\xfe", b"1" * 5000):
        assert _post(pool, "/chat/completions", body).status_code == 422, body[:10]
    # the edges that are allowed
    for ok in ({"temperature": 0}, {"temperature": 0.01}, {"top_p": 1.2e-38}, {"stop": "x"}):
        assert _chat(pool, max_tokens=1, **ok).status_code == 200, ok


def test_prompt_length_is_capped(pool) -> None:
    r = _chat(pool, messages=[{"role": "user", "content": "1+2= " * 200}])
    assert r.status_code == 400
    assert "endpoint.max_prompt_tokens" in r.json()["error"]["message"]
    assert _chat(pool, messages=[{"role": "user", "content": ""}], max_tokens=1).status_code == 200


class BlockingTokenizer:
    """The real tokenizer, whose chat template waits for ``release`` once ``block`` is set."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.block, self.rendering, self.release = (threading.Event() for _ in range(3))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        if self.block.is_set():
            self.rendering.set()
            assert self.release.wait(60)
        return self._tok.apply_chat_template(*args, **kwargs)


def test_health_answers_while_a_template_renders(tmp_path: Path) -> None:
    _, tok = load_model_and_tokenizer("tiny-small")
    slow = BlockingTokenizer(tok)
    with served(endpoint_cfg(tmp_path), tmp_path, tokenizer=slow, engine=ScriptedEngine(tok)) as p:
        auth = {"Authorization": f"Bearer {p.token}"}
        slow.block.set()
        out: dict = {}
        call = {"messages": MSGS, "max_tokens": 1}
        client = threading.Thread(
            target=lambda: out.setdefault(
                "r", httpx.post(f"{p.base_url}/chat/completions", json=call, headers=auth)
            )
        )
        client.start()
        assert slow.rendering.wait(60)
        # the render holds its thread, not the event loop
        health = httpx.get(f"{p.base_url}/health", headers=auth, timeout=60)
        assert health.status_code == 200 and "r" not in out
        slow.release.set()
        client.join(60)
        assert out["r"].status_code == 200


class FailingEngine(ScriptedEngine):
    """Fails the requests whose prompt holds a marker token: ValueError (a rejected
    request) or RuntimeError (a failure)."""

    def __init__(self, tokenizer: Any, markers: dict[int, type[Exception]]) -> None:
        super().__init__(tokenizer)
        self.markers = markers

    async def agenerate(self, request) -> GenerationResult:
        for marker, error in self.markers.items():
            if marker in request.prompt_ids:
                raise error("this request only")
        return await super().agenerate(request)


def test_one_calls_engine_failure_fails_that_call_alone(tmp_path: Path) -> None:
    _, tok = load_model_and_tokenizer("tiny-small")
    bad, rejected = tok.encode("7", add_special_tokens=False)[0], tok.encode("9")[-1]
    engine = FailingEngine(tok, {bad: RuntimeError, rejected: ValueError})
    with served(endpoint_cfg(tmp_path), tmp_path, engine=engine, stream=SampleStream(8, 0)) as p:
        auth = {"Authorization": f"Bearer {p.token}"}
        contents = ["1+2=", "7", "3+4=", "9", "5+5="] * 2
        replies: dict[int, httpx.Response] = {}

        def call(k: int) -> None:
            body = {"messages": [{"role": "user", "content": contents[k]}], "session_id": "s"}
            replies[k] = httpx.post(f"{p.base_url}/chat/completions", json=body, headers=auth)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(len(contents))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        codes = [replies[k].status_code for k in range(len(contents))]
        assert codes == [200, 500, 200, 400, 200] * 2
        assert "this request only" in replies[1].json()["error"]["message"]
        # the session goes on: its six good calls were recorded, the failed ones not
        r = httpx.post(f"{p.base_url}/sessions/s/reward", json={"reward": 1.0}, headers=auth)
        assert r.status_code == 200
        stats = p.pop_rollout_stats()
        assert stats["endpoint/failed_calls"] == 4 and stats["rollout/samples"] == 6


def test_the_smallest_accepted_sampling_parameters_run_in_the_real_sampler(
    tmp_path: Path,
) -> None:
    """top_p at float32's smallest normal number and temperature at its floor, batched
    with ordinary calls in the built-in engine: every call completes."""
    cfg = endpoint_cfg(tmp_path, "rollout.max_new_tokens=3")
    with served(cfg, tmp_path, engine="real") as p:
        auth = {"Authorization": f"Bearer {p.token}"}
        tiny = float(np.finfo(np.float32).tiny)
        params = [{"top_p": tiny}, {"temperature": 0.01}, {}, {"temperature": 0}, {}]
        replies: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda kw=kw: replies.append(
                    httpx.post(
                        f"{p.base_url}/chat/completions",
                        json={"messages": MSGS, "n": 4, **kw},
                        headers=auth,
                        timeout=60,
                    )
                )
            )
            for kw in params
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [r.status_code for r in replies] == [200] * len(params)
        assert all(len(r.json()["choices"]) == 4 for r in replies)

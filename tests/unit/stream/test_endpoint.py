"""The OpenAI-compatible endpoint, with the real `openai` client against the real server:
auth, logprobs, tool calls, sessions, rewards, admission that waits, bad requests."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import httpx
import openai
import pytest

from streamrl.models import load_model_and_tokenizer
from streamrl.run.assembly import rollout_spec
from streamrl.run.launch import train
from streamrl.stream.endpoint.pool import EndpointPool
from streamrl.stream.sample_stream import SampleStream
from tests.endpoint_harness import ScriptedEngine, endpoint_cfg, wait_endpoint


def _reward(base: str, token: str, session: str, **body) -> httpx.Response:
    return httpx.post(
        f"{base}/sessions/{session}/reward", json=body, headers={"Authorization": f"Bearer {token}"}
    )


def test_sessions_rewards_auth_logprobs_and_admission(tmp_path: Path) -> None:
    cfg = endpoint_cfg(tmp_path)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("result", train(cfg)), daemon=True)
    runner.start()
    base, token = wait_endpoint(tmp_path / "served", runner)
    token_file = tmp_path / "served" / "endpoint_token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong").models.list()
    assert httpx.get(f"{base}/models").status_code == 401  # no token at all
    assert httpx.get(f"{base}/health").status_code == 401  # the versioned one needs it
    root = base.removesuffix("/v1")
    probe = httpx.get(f"{root}/health")  # liveness for probes that carry no secret
    assert probe.status_code == 200 and probe.json() == {"status": "ok"}
    assert httpx.post(f"{root}/health").status_code == 401  # GET /health alone
    assert httpx.get(f"{root}/health/x").status_code == 401
    client = openai.OpenAI(base_url=base, api_key=token)
    assert [m.id for m in client.models.list()] == ["tiny-small"]

    msgs = [{"role": "user", "content": "1+2="}]
    reply = client.chat.completions.create(
        model="tiny-small",
        messages=msgs,
        n=2,
        logprobs=True,
        max_tokens=3,
        extra_body={"session_id": "a"},
    )
    assert len(reply.choices) == 2
    for c in reply.choices:
        assert len(c.logprobs.content) == len(c.model_extra["streamrl"]["token_ids"]) <= 3
        assert all(t.logprob <= 0 for t in c.logprobs.content)
        assert c.model_extra["streamrl"]["versions"] == [0] * len(c.logprobs.content)

    # eta = 0 and one item per step: session "b" cannot start before "a" is consumed
    pending: dict = {}

    def second() -> None:
        pending["reply"] = client.chat.completions.create(
            model="x", messages=msgs, max_tokens=2, extra_body={"session_id": "b"}
        )

    waiter = threading.Thread(target=second, daemon=True)
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive(), "a call was admitted past the staleness bound"
    # a malformed request and an unknown session are 4xx; the server goes on
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="x", messages=[], max_tokens=2)
    assert _reward(base, token, "nope", reward=1.0).status_code == 404
    assert _reward(base, token, "a", rewards=[1.0]).status_code == 422  # two completions
    assert _reward(base, token, "a", rewards=[1.0, 0.0]).status_code == 200
    waiter.join(60)
    assert "reply" in pending, "the waiting call was never admitted"
    assert pending["reply"].choices[0].model_extra["streamrl"]["versions"][0] == 1
    assert _reward(base, token, "b", reward=0.5).status_code == 200
    runner.join(120)
    summary = out["result"].summary
    assert summary["stream/consumed"] == 2 and summary["stream/issued"] == 2
    rows = (tmp_path / "served" / "metrics.jsonl").read_text().splitlines()
    first = json.loads(rows[1])
    assert first["rollout/reward_mean"] == 0.5 and first["endpoint/calls"] >= 1


def test_tool_calls_come_back_in_openai_format(tmp_path: Path) -> None:
    cfg = endpoint_cfg(tmp_path)
    _, tokenizer = load_model_and_tokenizer("tiny-small")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, "Let me compute." + call)
    stream = SampleStream(1, 0)
    pool = EndpointPool(
        cfg.endpoint, rollout_spec(cfg), None, tokenizer, {}, 0, stream, tmp_path, engine=engine
    )
    pool.start()
    try:
        client = openai.OpenAI(base_url=pool.base_url, api_key=pool.token)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": "Arithmetic.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string"}},
                        "required": ["expression"],
                    },
                },
            }
        ]
        reply = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "2+2?"}], tools=tools
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me compute."
        (tc,) = choice.message.tool_calls
        assert tc.function.name == "calculator"
        assert json.loads(tc.function.arguments) == {"expression": "2+2"}
        # the agent sends the call and its result back: the history renders again
        again = client.chat.completions.create(
            model="x",
            messages=[
                {"role": "user", "content": "2+2?"},
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": tc.id, "content": "4"},
            ],
        )
        assert again.choices[0].finish_reason == "tool_calls"
    finally:
        pool.stop()
        stream.close()

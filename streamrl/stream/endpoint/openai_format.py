"""OpenAI chat-completions wire format: requests in, responses out.

Only what the official ``openai`` client sends and reads. Request bodies are strict
JSON (:func:`parse_body`: no NaN, infinity or overflowing number anywhere) validated by
pydantic models that refuse non-finite floats too, and sampling parameters the float32
sampler could not take; a malformed body is one 422 naming the field, and the server
goes on. Responses follow the chat-completion object: ``choices[i].message`` with
``content`` and ``tool_calls``, ``logprobs.content`` (one entry per generated token;
``top_logprobs`` is always empty: the engine returns only the sampled token's
log-prob), ``finish_reason`` and ``usage``. Each choice also carries
``streamrl: {token_ids, versions}``, which the official client keeps as an extra field.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from streamrl.core.types import GenerationResult
from streamrl.rollout.tools.base import ToolCall

B = TypeVar("B", bound=BaseModel)


class EndpointError(Exception):
    """An HTTP error for the client: ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


MIN_TEMPERATURE = 0.01  # vLLM's floor too: logits / t overflows float32 for tiny t
MIN_TOP_P = float(np.finfo(np.float32).tiny)  # smaller ones are 0 (or subnormal) in float32
MAX_REWARD = 1e9  # |reward|: squares and sums of rewards stay finite in float32
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # OpenAI allows 4 stop sequences
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class _Body(BaseModel):
    """A request body: every float must be finite (NaN and infinity are a 422)."""

    model_config = ConfigDict(allow_inf_nan=False)


class ChatRequest(_Body):
    model_config = ConfigDict(extra="ignore")  # clients send fields we do not use

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=64)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)  # only the sampled token
    stop: str | list[str] | None = None
    seed: int | None = None
    session_id: SessionId | None = None  # via extra_body

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float | None) -> float | None:
        if t is not None and 0 < t < MIN_TEMPERATURE:
            raise ValueError(
                f"must be 0 (greedy) or at least {MIN_TEMPERATURE}: smaller ones overflow "
                "the logits"
            )
        return t

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, p: float | None) -> float | None:
        if p is not None and p < MIN_TOP_P:  # the engine samples in float32
            raise ValueError(f"must be at least {MIN_TOP_P} (float32's smallest normal number)")
        return p

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("not supported by this endpoint (give 0 or leave it out)")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(stops)}")
        if any(not 1 <= len(s) <= MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop sequence has 1 to {MAX_STOP_CHARS} characters")
        return stops


Reward = Annotated[float, Field(ge=-MAX_REWARD, le=MAX_REWARD)]


class RewardRequest(_Body):
    model_config = ConfigDict(extra="forbid")

    reward: Reward | None = None  # one reward for every call of the session
    rewards: list[Reward] | None = None  # or one per recorded completion, in order

    @model_validator(mode="after")
    def _one(self) -> RewardRequest:
        if (self.reward is None) == (self.rewards is None):
            raise ValueError("give exactly one of 'reward' and 'rewards'")
        return self


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows (only finite numbers)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a float (only finite numbers)")
    return value


def parse_body(raw: bytes, model: type[B]) -> B:
    """A request body: strict JSON (no NaN, Infinity or overflowing numbers anywhere,
    fields we ignore included), then ``model``'s rules. Every problem is one 422
    naming the field."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise EndpointError(422, "body: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, the two above
        raise EndpointError(422, f"body: invalid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise EndpointError(422, describe(e)) from None


def describe(e: ValidationError) -> str:
    """One line: each bad field's dotted path and what is wrong with it."""
    parts = []
    for err in e.errors(include_url=False):
        where = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def to_template_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """OpenAI messages -> what a chat template renders. An assistant message's tool
    calls go back into its text in the Hermes format the model wrote them in."""
    out = []
    for m in messages:
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise ValueError(f"messages: unknown role {role!r}")
        text = text_of(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            args = fn.get("arguments", "{}")
            with contextlib.suppress(json.JSONDecodeError):  # keep a malformed string as is
                args = json.loads(args) if isinstance(args, str) else args
            text += "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args})
            text += "</tool_call>"
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out


def choice(
    index: int,
    res: GenerationResult,
    tokenizer: Any,
    *,
    logprobs: bool,
    parser: Any,
) -> dict[str, Any]:
    ids = list(res.token_ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    content, calls = parser(text)
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
        if isinstance(c, ToolCall)  # a malformed call stays in the content as text
    ]
    if tool_calls:
        finish: Literal["stop", "length", "tool_calls"] = "tool_calls"
    else:
        content, finish = text, ("length" if res.finish_reason == "length" else "stop")
    out: dict[str, Any] = {
        "index": index,
        "message": {
            "role": "assistant",
            "content": content if content or not tool_calls else None,
            **({"tool_calls": tool_calls} if tool_calls else {}),
        },
        "finish_reason": finish,
        "logprobs": None,
        "streamrl": {"token_ids": res.token_ids, "versions": res.versions},
    }
    if logprobs:
        out["logprobs"] = {
            "content": [
                {
                    "token": (piece := tokenizer.decode([t])),
                    "logprob": lp,
                    "bytes": list(piece.encode()),
                    "top_logprobs": [],
                }
                for t, lp in zip(res.token_ids, res.logprobs, strict=True)
            ]
        }
    return out


def completion(model: str, choices: list[dict], prompt_tokens: int) -> dict[str, Any]:
    generated = sum(len(c["streamrl"]["token_ids"]) for c in choices)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens * len(choices) + generated,
        },
    }

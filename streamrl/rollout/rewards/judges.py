"""Where a judged reward's judge runs: one interface, three backends.

``pairwise_judge``, ``tournament_judge`` and ``rubric_judge`` take a ``judge`` option (a
:class:`JudgeSpec`) and ask its backend for greedy replies to a batch of prompts; the
reward never knows which backend answers:

- ``url``: an OpenAI-compatible ``/chat/completions`` at ``url`` (``streamrl serve`` of a
  frozen copy, vLLM, any server; tests use loopback). The batch's prompts are sent
  ``concurrency`` at a time (a batching server puts them in one forward pass).
- ``engine``: a frozen copy of ``model`` (a preset such as ``smollm2-135m-instruct``, or a
  checkpoint directory) in streamrl's own inference engine, loaded once per process; a
  batch is one ``generate`` call, so a group's comparisons share forward passes.
- ``policy``: the policy itself, through the rollout worker's own engine (the weights
  it rolls out with). The rollout worker binds its engine to the reward when it is built
  (:meth:`~streamrl.rollout.rewards.CompositeReward.bind_policy`), so it needs
  ``reward.isolation: thread``. Staleness: the judge answers with the weights the engine
  holds when the group is scored, never older than the group's own samples and at most
  the versions published since (within ``stream.max_staleness``); its requests are
  batched with the worker's rollouts and are never trained on.

>>> JudgeSpec(backend="engine", model="tiny").backend
'engine'
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from streamrl.rollout.rewards.llm_judge import Judge, load_judge


class JudgeSpec(BaseModel):
    """A judge: which backend, and what it needs (the ``judge`` option of a judged reward)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    backend: Literal["url", "engine", "policy"] = Field(
        "url", description="url: an OpenAI-compatible server; engine: a frozen model; policy"
    )
    url: str = Field("", description="url backend: the base URL (http://host:port/v1)")
    model: str = Field(
        "", description="url: the served model's name; engine: a preset or checkpoint path"
    )
    api_key: str = Field("", description="url backend: a bearer token")
    timeout_s: float = Field(30.0, gt=0, description="url backend: per request")
    concurrency: int = Field(8, ge=1, description="url backend: requests in flight")
    max_new_tokens: int = Field(8, ge=1, description="the judge's reply budget (greedy)")
    chat: bool = Field(True, description="engine/policy: wrap prompts in the chat template")
    device: str = Field("cpu", description="engine backend: where the frozen model runs")
    decode_slots: int = Field(16, ge=1, description="engine backend: its batch of sequences")
    seed: int = Field(0, description="engine backend: a preset's initialisation seed")
    _policy: Any = PrivateAttr(default=None)  # (engine, tokenizer), bound by the worker

    def with_policy(self, engine: Any, tokenizer: Any) -> JudgeSpec:
        """This spec with the rollout worker's engine bound (``backend: policy``)."""
        bound = self.model_copy()
        bound._policy = (engine, tokenizer)
        return bound


class JudgeBackend(Protocol):
    """Greedy replies to a batch of prompts, in order."""

    def ask(self, prompts: Sequence[str]) -> list[str]: ...


class UrlJudge:
    """A judge behind an OpenAI-compatible ``/chat/completions``."""

    def __init__(self, spec: JudgeSpec) -> None:
        self.spec = spec
        self.endpoint = f"{spec.url.rstrip('/')}/chat/completions"
        self.headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}

    def _one(self, client: httpx.Client, prompt: str) -> str:
        body = {
            "model": self.spec.model or "judge",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.spec.max_new_tokens,
            "temperature": 0.0,
        }
        reply = client.post(self.endpoint, json=body, headers=self.headers)
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"] or ""

    def ask(self, prompts: Sequence[str]) -> list[str]:
        with httpx.Client(timeout=self.spec.timeout_s) as client:
            if len(prompts) <= 1:
                return [self._one(client, p) for p in prompts]
            workers = min(self.spec.concurrency, len(prompts))
            with ThreadPoolExecutor(workers, thread_name_prefix="streamrl-judge") as pool:
                return list(pool.map(lambda p: self._one(client, p), prompts))


class EngineJudge:
    """A judge in an inference engine: a frozen model's, or the policy's own."""

    def __init__(self, judge: Judge, spec: JudgeSpec) -> None:
        self.judge, self.spec = judge, spec

    def ask(self, prompts: Sequence[str]) -> list[str]:
        return self.judge.ask_all(prompts, self.spec.max_new_tokens, self.spec.chat)


def judge_backend(spec: JudgeSpec) -> JudgeBackend:
    """The backend ``spec`` names (the engine backend's model loads once per process)."""
    if spec.backend == "url":
        return UrlJudge(spec)
    if spec.backend == "engine":
        return EngineJudge(load_judge(spec.model, spec.device, spec.seed, spec.decode_slots), spec)
    if spec._policy is None:
        raise ValueError(
            "judge backend 'policy' is not bound to a rollout worker's engine (it judges "
            "only inside a run's rollout workers)"
        )
    engine, tokenizer = spec._policy
    return EngineJudge(Judge(engine, tokenizer), spec)


def bind_policy(value: Any, engine: Any, tokenizer: Any) -> Any:
    """An option ``value`` with the policy's engine bound where it is a policy judge."""
    if isinstance(value, JudgeSpec) and value.backend == "policy":
        return value.with_policy(engine, tokenizer)
    return value


def setup(options: dict[str, Any], load: bool) -> None:
    """Check a judged reward's ``judge`` when a composite is built; with ``load`` (thread
    isolation) load a frozen judge now, so that no guarded call is charged the loading."""
    spec = options.get("judge")
    if not isinstance(spec, JudgeSpec):
        raise ValueError(
            "judge: where the judge runs, e.g. {backend: url, url: http://127.0.0.1:8000/v1}, "
            "{backend: engine, model: smollm2-135m-instruct} or {backend: policy}"
        )
    if spec.backend == "url" and not spec.url.startswith(("http://", "https://")):
        raise ValueError("judge.url: the judge's OpenAI-compatible base URL (http://host:port/v1)")
    if spec.backend == "engine":
        if not spec.model:
            raise ValueError("judge.model: the frozen judge (a preset name or a local path)")
        if load:
            load_judge(spec.model, spec.device, spec.seed, spec.decode_slots)
        else:  # (fails now, naming the path, rather than in every worker's first call)
            from streamrl.models.loading import check_model_source

            check_model_source(spec.model)
    if spec.backend == "policy" and not load:
        raise ValueError(
            "judge backend 'policy' asks the rollout worker's own engine: it needs "
            "reward.isolation: thread"
        )

"""The HTTP routes of the endpoint (FastAPI), all behind a bearer token but one probe.

    GET  /v1/models                          the served model
    POST /v1/chat/completions                OpenAI chat completions (+ ``session_id``)
    POST /v1/sessions/{session_id}/reward    end a session: {"reward": r} or {"rewards": [...]}
    GET  /v1/health                          liveness and the served version (token)
    GET  /health                             liveness without a token (the guard answers)

Every request passes :class:`~streamrl.stream.endpoint.guard.RequestGuard` first: without
``Authorization: Bearer <token>`` it gets 401 and its body is never read; a body over
``endpoint.max_body_bytes`` gets 413. There are no documentation routes (``/docs``,
``/redoc``, ``/openapi.json``). A malformed body, NaN or infinity anywhere in it
included, is a 422 naming the field; a prompt over ``endpoint.max_prompt_tokens``
a 400; an unknown session a 404. Chat templates render on a worker thread, so a large
request never holds the event loop (other clients, ``/v1/health``). The server goes on
serving after every error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError

from streamrl.core.engine import context_of
from streamrl.core.types import SamplingParams
from streamrl.rollout.episodes import sampling_params
from streamrl.stream.endpoint.guard import RequestGuard
from streamrl.stream.endpoint.openai_format import (
    ChatRequest,
    EndpointError,
    RewardRequest,
    SessionId,
    choice,
    completion,
    parse_body,
    to_template_messages,
)

if TYPE_CHECKING:
    from streamrl.stream.endpoint.pool import EndpointPool

_SESSION_ID = TypeAdapter(SessionId)


def build_app(pool: EndpointPool) -> FastAPI:
    """The routes, over ``pool`` (sessions, admission, the engine)."""
    completions = ChatCompletions(pool)
    app = FastAPI(
        title="streamrl endpoint",
        lifespan=_lifespan(pool, completions.renderer),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    e = pool.endpoint
    app.add_middleware(
        RequestGuard,
        token=pool.token,
        max_body_bytes=e.max_body_bytes,
        read_timeout_s=e.read_timeout_s,
    )

    @app.exception_handler(EndpointError)
    async def endpoint_error(request: Request, exc: EndpointError) -> JSONResponse:
        kind = "authentication_error" if exc.status == 401 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(exc), "type": kind}}, status_code=exc.status)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": pool.engine.version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": completions.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "streamrl",
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        return await completions(request)

    @app.post("/v1/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> dict[str, Any]:
        body = parse_body(await request.body(), RewardRequest)
        await pool.report_reward(session_id, body.reward, body.rewards)
        return {"session_id": session_id, "status": "recorded"}

    return app


def _lifespan(
    pool: EndpointPool, renderer: ThreadPoolExecutor
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """While the app serves: expire idle sessions every second and admit calls to the
    stream; at shutdown stop both and the render thread."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def expire() -> None:
            while True:
                await asyncio.sleep(1.0)
                pool.expire_sessions()

        tasks = [asyncio.create_task(expire()), asyncio.create_task(pool.admit_forever())]
        yield
        for task in tasks:
            task.cancel()
        renderer.shutdown(wait=False, cancel_futures=True)

    return lifespan


class ChatCompletions:
    """``POST /v1/chat/completions``: render the messages (on the render thread), check
    the prompt's length, sample with the run's sampling settings overridden by the
    request's, generate through the pool (in the call's session, if any) and answer in
    OpenAI's format."""

    def __init__(self, pool: EndpointPool) -> None:
        from streamrl.rollout.tools import get_tool_parser

        e = pool.endpoint
        self.pool, self.tokenizer = pool, pool.tokenizer
        self.parser = get_tool_parser(e.tool_parser)
        self.model_name = pool.spec.model.name_or_path
        self.defaults = sampling_params(pool.spec.rollout, self.tokenizer)
        # prompt + completion tokens (an engine plugged in by a test may not say)
        self.context = context_of(pool.engine)
        limits = [e.max_prompt_tokens, self.context - 1 if self.context else None]
        self.max_prompt = min((x for x in limits if x is not None), default=None)
        # one thread: a Hugging Face tokenizer is not safe to share between threads
        self.renderer = ThreadPoolExecutor(1, "endpoint-render")

    async def __call__(self, request: Request) -> dict[str, Any]:
        req = parse_body(await request.body(), ChatRequest)
        session_id = req.session_id or request.headers.get("x-session-id") or None
        if session_id is not None:
            try:
                session_id = _SESSION_ID.validate_python(session_id)
            except ValidationError:
                raise EndpointError(422, "session_id: 1 to 200 characters") from None
        prompt_ids = await self.prompt_ids(req)
        params = self.params(req, len(prompt_ids))
        if session_id is None:
            results = await self.pool.generate(prompt_ids, params, req.n, None)
        else:
            async with self.pool.table.call(session_id) as session:
                results = await self.pool.generate(prompt_ids, params, req.n, session)
        choices = [
            choice(i, r, self.tokenizer, logprobs=req.logprobs, parser=self.parser)
            for i, r in enumerate(results)
        ]
        return completion(req.model or self.model_name, choices, len(prompt_ids))

    async def prompt_ids(self, req: ChatRequest) -> list[int]:
        """The rendered prompt, checked: not empty, and within the prompt limit."""
        loop = asyncio.get_running_loop()
        prompt_ids = await loop.run_in_executor(self.renderer, self.render, req)
        if not prompt_ids:
            raise EndpointError(400, "the messages render to an empty prompt")
        if self.max_prompt is not None and len(prompt_ids) > self.max_prompt:
            raise EndpointError(
                400,
                f"the rendered prompt has {len(prompt_ids)} tokens; at most {self.max_prompt} "
                "(endpoint.max_prompt_tokens, or the model's context less one)",
            )
        return prompt_ids

    def render(self, req: ChatRequest) -> list[int]:
        """The prompt's token ids (on the render thread)."""
        try:
            messages = to_template_messages(req.messages)
            ids = self.tokenizer.apply_chat_template(
                messages,
                tools=req.tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            return [int(i) for i in ids]
        except Exception as exc:  # a template that rejects these messages
            raise EndpointError(400, f"messages cannot be rendered: {exc}") from None

    def params(self, req: ChatRequest, n_prompt: int) -> SamplingParams:
        """The run's sampling settings, overridden by the request's; the completion
        stops at the model's context."""
        d = self.defaults
        wanted = req.max_completion_tokens or req.max_tokens or d.max_new_tokens
        room = self.context - n_prompt if self.context else wanted  # the engine stops there
        return replace(
            d,
            temperature=d.temperature if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            max_new_tokens=min(wanted, room),
            stop=list(d.stop) + list(req.stop or []),
        )

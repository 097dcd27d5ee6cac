"""The HTTP routes of the Tinker API (FastAPI), all behind ``X-API-Key: <token>``.

The routes are the ones the official ``tinker`` client calls (``/api/v1/...``): the
client's config, sessions and heartbeats, ``create_model`` / ``get_info``,
``forward_backward`` (protobuf), ``optim_step``, ``save_weights``,
``save_weights_for_sampler``, ``load_weights``, sampling sessions and ``asample``,
``retrieve_future``, capabilities, health and telemetry (accepted, discarded).

Every request passes the OpenAI endpoint's
:class:`~streamrl.stream.endpoint.guard.RequestGuard` first: 401 without the token (its
body never read), 413 over ``tinker.max_body_bytes``, 408 for a body slower than
``tinker.read_timeout_s``. A malformed body is a 400 or 422 naming the field, an unknown
id a 404; a request that fails while it computes fails its future alone (category
``user`` when the caller can fix it). The server goes on serving after every error.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from tinker import types

from streamrl.stream.endpoint.guard import RequestGuard
from streamrl.stream.endpoint.openai_format import EndpointError, parse_body
from streamrl.stream.endpoint.tinker.futures import Result
from streamrl.stream.endpoint.tinker.sampling import ask_for
from streamrl.stream.endpoint.tinker.service import TinkerService
from streamrl.stream.endpoint.tinker.wire import decode_forward_backward, encode_sample

PROTO = "application/x-protobuf"

# the client's feature flags: plain httpx (no pyqwest), forward_backward chunks one after
# the other (so they arrive in order), custom losses run on the client
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "custom_loss_server_side": False,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
}


def build_app(service: TinkerService, token: str) -> FastAPI:
    cfg = service.cfg

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.futures.cancel_all()

    app = FastAPI(
        title="streamrl tinker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(
        RequestGuard,
        token=token,
        max_body_bytes=cfg.max_body_bytes,
        read_timeout_s=cfg.read_timeout_s,
        header=b"x-api-key",
        scheme="",
    )

    @app.exception_handler(EndpointError)
    async def endpoint_error(request: Request, exc: EndpointError) -> JSONResponse:
        body = {"error": {"message": str(exc), "type": "invalid_request_error"}}
        return JSONResponse(body, status_code=exc.status)

    _service_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    return app


async def _body(request: Request, model: type) -> Any:
    return parse_body(await request.body(), model)


def _future(request_id: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id, **extra}


def _service_routes(app: FastAPI, service: TinkerService) -> None:
    @app.get("/api/v1/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {"refresh_interval_sec": 3600, "sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        models = [
            {"model_name": m.path, "trainable": True, "sampleable": True}
            for m in service.bases.models
        ]
        return {"supported_models": models}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        await _body(request, types.CreateSessionRequest)
        return {"type": "create_session", "session_id": service.create_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        req = await _body(request, types.SessionHeartbeatRequest)
        if req.session_id not in service.sessions:
            raise EndpointError(410, f"session {req.session_id!r} is finished")
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> Response:
        service.finish_session(session_id)
        return Response(status_code=200)

    @app.post("/api/v1/retrieve_future")
    async def retrieve(request: Request) -> Response:
        req = await _body(request, types.FutureRetrieveRequest)
        if not service.futures.known(req.request_id):
            raise EndpointError(404, f"request_id {req.request_id!r}: unknown or expired")
        status, body = await service.futures.retrieve(req.request_id, service.cfg.poll_s)
        if isinstance(body, bytes):
            return Response(body, status_code=status, media_type=PROTO)
        return JSONResponse(body, status_code=status)


def _training_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        req = await _body(request, types.CreateModelRequest)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        return _future(service.create_model(req), model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        req = await _body(request, types.GetInfoRequest)
        return service.info(req.model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if PROTO not in request.headers.get("content-type", ""):
            raise EndpointError(415, f"forward_backward: the body must be {PROTO}")
        call = decode_forward_backward(
            await request.body(), request.headers.get("content-encoding")
        )
        return _future(service.forward_backward(call), call.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        req = await _body(request, types.OptimStepRequest)
        return _future(service.optim_step(req), req.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        req = await _body(request, types.SaveWeightsRequest)
        return _future(service.save_state(req), req.model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        req = await _body(request, types.SaveWeightsForSamplerRequest)
        return _future(service.save_for_sampler(req), req.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        req = await _body(request, types.LoadWeightsRequest)
        return _future(service.load_state(req), req.model_id)


def _sampling_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        req = await _body(request, types.CreateSamplingSessionRequest)
        sampler_id = await service.create_sampling_session(req)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        snap = service.sampler(sampler_id)
        return {
            "sampler_id": sampler_id,
            "base_model": snap.base.path,
            "model_path": snap.model_path,
        }

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        req = await _body(request, types.SampleRequest)
        if req.sampling_session_id is None:
            raise EndpointError(400, "asample: give sampling_session_id (a sampling client's)")
        snap = service.sampler(req.sampling_session_id)
        _, tokenizer = snap.base.load()
        try:
            ask = ask_for(req, tokenizer, snap.base.context)
        except ValueError as e:
            raise EndpointError(400, str(e)) from None

        async def work() -> Result:
            sequences, prompt_lp = await service.samplers.sample(snap, ask)
            return Result(proto=encode_sample(sequences, prompt_lp))

        request_id = service.futures.submit(work(), "sample")
        ids = [f"{req.sampling_session_id}:{req.seq_id}:{i}" for i in range(ask.num_samples)]
        return _future(request_id, sample_sequence_ids=ids)

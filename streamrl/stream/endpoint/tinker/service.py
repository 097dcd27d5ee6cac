"""The service behind the routes: sessions, training runs, snapshots and sampling sessions.

Everything that trains or writes a checkpoint runs on one thread (``tinker-train``) in
the order the requests arrived, which for one training client is the order it sent them;
sampling runs on the engines' threads (:mod:`.sampling`). Each call that computes returns
a future id at once (:mod:`.futures`).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinker import types

from streamrl.config.tinker import TinkerConfig
from streamrl.stream.endpoint.openai_format import EndpointError
from streamrl.stream.endpoint.tinker import checkpoints as ck
from streamrl.stream.endpoint.tinker.adapters import LoraSpec, adapter_state, load_adapter
from streamrl.stream.endpoint.tinker.bases import BaseModels
from streamrl.stream.endpoint.tinker.futures import Futures, Result, UserError
from streamrl.stream.endpoint.tinker.runs import AdamStep, Run
from streamrl.stream.endpoint.tinker.sampling import Samplers, Snapshot
from streamrl.stream.endpoint.tinker.wire import ForwardBackward, encode_forward_backward


@dataclass
class Session:
    id: str
    runs: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)


class TinkerService:
    def __init__(self, cfg: TinkerConfig, state_dir: Path, seed: int = 0) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.bases = BaseModels(cfg.models, state_dir, seed)
        self.lora_alpha = cfg.lora_alpha
        self.futures = Futures()
        self.samplers = Samplers(cfg.max_samplers, cfg.decode_slots)
        self.sessions: dict[str, Session] = {}
        self.runs: dict[str, Run] = {}
        self.snapshots: dict[str, Snapshot] = {}  # by sampling session id
        self._snap_ids = itertools.count(1)
        self._train = ThreadPoolExecutor(1, "tinker-train")

    def close(self) -> None:
        self.futures.cancel_all()
        self._train.shutdown(wait=True, cancel_futures=True)
        self.samplers.close()

    # ----------------------------------------------------------------- sessions
    def create_session(self) -> str:
        sid = secrets.token_hex(8)
        self.sessions[sid] = Session(sid)
        return sid

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise EndpointError(404, f"session {sid!r}: unknown (finished, or never created)")
        return s

    def finish_session(self, sid: str) -> None:
        """Frees the session's runs and sampling sessions (checkpoints stay on disk)."""
        s = self.sessions.pop(sid, None)
        if s is None:
            return
        for model_id in s.runs:
            self.runs.pop(model_id, None)
        for sampler in s.samplers:
            self.snapshots.pop(sampler, None)

    # ----------------------------------------------------------------- training
    def run(self, model_id: str) -> Run:
        run = self.runs.get(model_id)
        if run is None:
            raise EndpointError(404, f"model_id {model_id!r}: no such training run here")
        return run

    def _on_train(self, fn: Callable[[], Result], kind: str) -> str:
        """Queues ``fn`` on the training thread now (so in arrival order); its future id."""
        loop = asyncio.get_running_loop()
        return self.futures.submit(loop.run_in_executor(self._train, fn), kind)

    def create_model(self, req: types.CreateModelRequest) -> str:
        session = self.session(req.session_id)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        if model_id in self.runs:  # a retried request
            return self._on_train(lambda: Result({"model_id": model_id}), "create")
        base = self.bases.get(req.base_model)
        lora = req.lora_config or types.LoraConfig(rank=32)
        try:
            spec = LoraSpec(
                rank=lora.rank,
                alpha=self.lora_alpha,
                train_attn=lora.train_attn,
                train_mlp=lora.train_mlp,
                train_unembed=lora.train_unembed,
                seed=lora.seed,
            )
        except ValueError as e:
            raise EndpointError(400, str(e)) from None
        if len(self.runs) >= self.cfg.max_runs:
            raise EndpointError(
                429, f"{len(self.runs)} training runs are held (tinker.max_runs); finish a session"
            )

        def create() -> Result:
            self.runs[model_id] = Run(model_id, base, spec)
            return Result({"model_id": model_id, "type": "create_model"})

        session.runs.append(model_id)
        return self._on_train(create, "create")

    def info(self, model_id: str) -> dict[str, Any]:
        run = self.run(model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {
                "arch": type(run.model).__name__,
                "model_name": run.base.path,
                "tokenizer_id": run.base.path,
            },
            "is_lora": True,
            "lora_rank": run.spec.rank,
            "model_name": run.base.path,
        }

    def forward_backward(self, call: ForwardBackward) -> str:
        run = self.run(call.model_id)

        def work() -> Result:
            outputs, metrics = run.forward_backward(call)
            return Result(proto=encode_forward_backward(outputs, metrics))

        return self._on_train(work, "fwdbwd")

    def optim_step(self, req: types.OptimStepRequest) -> str:
        run = self.run(req.model_id)
        p = req.optim_params
        if not isinstance(p, types.AdamParams):
            raise EndpointError(400, f"optim_params: only AdamParams are served (got {p.type!r})")
        step = AdamStep(p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm)
        return self._on_train(lambda: Result({"metrics": run.optim_step(step)}), "optim")

    # ----------------------------------------------------------------- checkpoints
    def save_state(self, req: types.SaveWeightsRequest) -> str:
        run = self.run(req.model_id)
        name = req.path or f"step-{run.steps:06d}"
        target = self._checkpoint(req.model_id, "weights", name)

        def work() -> Result:
            if target.exists() and not req.overwrite:
                raise UserError(
                    f"{target.path} exists; save_state(..., overwrite=True) replaces it"
                )
            ck.save(target, run, optimizer=True, meta={"user_metadata": req.user_metadata})
            return Result({"path": target.path, "type": "save_weights"})

        return self._on_train(work, "save")

    def save_for_sampler(self, req: types.SaveWeightsForSamplerRequest) -> str:
        run = self.run(req.model_id)
        session_id = req.model_id.split(":train:")[0]
        if req.path is None and req.sampling_session_seq_id is None:
            raise EndpointError(
                400, "save_weights_for_sampler: give path or sampling_session_seq_id"
            )
        target = (
            None
            if req.path is None
            else self._checkpoint(req.model_id, "sampler_weights", req.path)
        )

        def work() -> Result:
            if target is not None:
                ck.save(target, run, optimizer=False, meta={"user_metadata": req.user_metadata})
                return Result({"path": target.path, "type": "save_weights_for_sampler"})
            sampler_id = f"{session_id}:sample:{req.sampling_session_seq_id}"
            snap_id = f"{run.model_id}@{next(self._snap_ids)}"
            adapter = adapter_state(run.model)
            self._bind(sampler_id, Snapshot(snap_id, run.base, run.model_id, run.spec, adapter))
            return Result({"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})

        return self._on_train(work, "save")

    def load_state(self, req: types.LoadWeightsRequest) -> str:
        source = self._checkpoint_at(req.path)
        if req.model_id is None and req.session_id is None:
            raise EndpointError(400, "load_weights: give model_id, or session_id and model_seq_id")
        if req.model_id is not None:
            run_or_none: Run | None = self.run(req.model_id)
            model_id = req.model_id
        else:
            session = self.session(req.session_id)
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            run_or_none = None
            session.runs.append(model_id)

        def work() -> Result:
            loaded = ck.read(source, optimizer=req.optimizer)
            run = run_or_none or self._new_run_from(model_id, loaded, req.base_model)
            if run.spec.shape != loaded.spec.shape:
                raise UserError(
                    f"{source.path}: its LoRA config {loaded.spec} differs from the run's"
                )
            load_adapter(run.model, loaded.adapter)
            if loaded.optimizer is not None:
                run.optimizer.load_state_dict(loaded.optimizer)
                run.steps = int(loaded.meta.get("steps", 0))
            return Result({"path": source.path, "model_id": model_id, "type": "load_weights"})

        return self._on_train(work, "load")

    def _new_run_from(self, model_id: str, loaded: ck.Loaded, base_model: str | None) -> Run:
        try:
            base = self.bases.get(base_model or loaded.meta["base_model"])
        except EndpointError as e:
            raise UserError(str(e)) from None
        run = Run(model_id, base, loaded.spec)
        self.runs[model_id] = run
        return run

    def _checkpoint(self, model_id: str, kind: str, name: str) -> ck.Checkpoint:
        try:
            return ck.checkpoint_for(self.state_dir, model_id, kind, name)
        except ck.CheckpointError as e:
            raise EndpointError(400, str(e)) from None

    def _checkpoint_at(self, path: str) -> ck.Checkpoint:
        try:
            return ck.locate(self.state_dir, path)
        except ck.CheckpointError as e:
            raise EndpointError(400, str(e)) from None

    # ----------------------------------------------------------------- sampling sessions
    def _bind(self, sampler_id: str, snap: Snapshot) -> None:
        self.snapshots[sampler_id] = snap
        session = self.sessions.get(sampler_id.split(":sample:")[0])
        if session is not None:
            session.samplers.append(sampler_id)

    async def create_sampling_session(self, req: types.CreateSamplingSessionRequest) -> str:
        self.session(req.session_id)
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        if req.model_path is None:
            base = self.bases.get(req.base_model)
            self._bind(sampler_id, Snapshot(f"base:{base.path}", base, f"base:{base.path}"))
            return sampler_id
        source = self._checkpoint_at(req.model_path)
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(None, lambda: ck.read(source, optimizer=False))
        except ck.CheckpointError as e:
            raise EndpointError(404 if "no such" in str(e) else 400, str(e)) from None
        base = self.bases.get(req.base_model or loaded.meta["base_model"])
        engine_key = str(loaded.meta.get("model_id", req.model_path))
        snap_id = f"{req.model_path}@{loaded.meta.get('time')}"
        snap = Snapshot(snap_id, base, engine_key, loaded.spec, loaded.adapter, req.model_path)
        self._bind(sampler_id, snap)
        return sampler_id

    def sampler(self, sampler_id: str) -> Snapshot:
        snap = self.snapshots.get(sampler_id)
        if snap is None:
            raise EndpointError(404, f"sampling session {sampler_id!r}: unknown")
        return snap

"""Sampling on streamrl's built-in inference engine (``LocalEngine``), one engine per
training run (and one per base model sampled as it is), all over the shared base weights.

A sampling client is bound to a :class:`Snapshot`: a base model and, for a trained model,
the adapter tensors saved at ``save_weights_for_sampler`` time. An engine holds one
snapshot's adapter at a time; switching to another snapshot waits until the engine has
no sequence in flight, then loads only the adapter's tensors (``update_weights`` with the
LoRA tensors: an adapter publish moves the adapter's bytes, never the base's). So every
token a client gets comes from its snapshot's weights, and a later ``optim_step`` of the
run never reaches a snapshot taken before it.

Log-probs are the engine's: log p(token) under the distribution it was drawn from
(temperature / top-k / top-p applied); at temperature 1 with no top-k / top-p, the
model's own log-softmax, which ``forward_backward`` computes too.
"""

from __future__ import annotations

import asyncio
import collections
import math
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.stream.endpoint.tinker.adapters import LoraSpec, check_adapter, with_adapter
from streamrl.stream.endpoint.tinker.bases import BaseModel, share
from streamrl.stream.endpoint.tinker.wire import Sequence

_U63 = (1 << 63) - 1


@dataclass(frozen=True)
class Snapshot:
    """Weights a sampling client samples: ``base`` plus ``adapter`` (None: the base)."""

    id: str
    base: BaseModel
    engine_key: str  # the run that made the adapter, or the base's path
    spec: LoraSpec | None = None
    adapter: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    model_path: str | None = None  # tinker:// path when saved under a name


@dataclass
class Ask:
    """One ``sample`` call, in the engine's terms."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    seed: int | None
    prompt_logprobs: bool


class _Engine:
    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.snapshot: str | None = None  # whose adapter it holds
        self.inflight = 0
        self.waiting: collections.deque[str] = collections.deque()
        self.changed = asyncio.Condition()
        self.adapter_bytes = 0  # bytes moved by the last adapter load


class Samplers:
    """The engines, created on first use and closed least-recently-used beyond ``limit``."""

    def __init__(self, limit: int, decode_slots: int) -> None:
        self.limit, self.decode_slots = limit, decode_slots
        self.engines: collections.OrderedDict[str, _Engine] = collections.OrderedDict()
        self.published_bytes = 0  # adapter bytes loaded into engines, all told

    async def sample(self, snap: Snapshot, ask: Ask) -> tuple[list[Sequence], np.ndarray | None]:
        e = await self._engine(snap)
        await self._acquire(e, snap)
        try:
            seeds = _seeds(ask.seed, ask.num_samples)
            jobs = [e.engine.agenerate(GenerationRequest(ask.prompt, ask.params, s)) for s in seeds]
            if ask.prompt_logprobs:
                jobs.append(e.engine.agenerate(_scoring(ask.prompt)))
            results = await asyncio.gather(*jobs)
        finally:
            await self._release(e)
        prompt_lp = None
        if ask.prompt_logprobs:
            scored = results.pop()
            prompt_lp = np.array([math.nan, *scored.logprobs], dtype=np.float32)
        seqs = [Sequence(r.token_ids, r.logprobs, r.finish_reason == "stop") for r in results]
        return seqs, prompt_lp

    def close(self) -> None:
        for e in self.engines.values():
            e.engine.close()
        self.engines.clear()

    # ----------------------------------------------------------------- engines
    async def _engine(self, snap: Snapshot) -> _Engine:
        e = self.engines.get(snap.engine_key)
        if e is None:
            loop = asyncio.get_running_loop()
            engine = await loop.run_in_executor(None, self._build, snap)
            e = self.engines.setdefault(snap.engine_key, _Engine(engine))
            self._evict()
        self.engines.move_to_end(snap.engine_key)
        return e

    def _build(self, snap: Snapshot) -> LocalEngine:
        base, tokenizer = snap.base.load()
        model = share(base) if snap.spec is None else with_adapter(base, snap.spec)
        model.requires_grad_(False)
        # the engine runs the model's own layer modules, so the adapters apply
        return LocalEngine(model, tokenizer, decode_slots=self.decode_slots, fuse_layers=False)

    def _evict(self) -> None:
        idle = [k for k, e in self.engines.items() if e.inflight == 0 and not e.waiting]
        while len(self.engines) > self.limit and idle:
            self.engines.pop(idle.pop(0)).engine.close()

    async def _acquire(self, e: _Engine, snap: Snapshot) -> None:
        """Waits until ``e`` serves ``snap``: at once if it already does and no other
        snapshot waits, else once its sequences in flight are done (then loads it)."""
        async with e.changed:
            e.waiting.append(snap.id)
            try:
                while not (
                    (e.snapshot == snap.id and e.waiting[0] == snap.id)
                    or (e.inflight == 0 and e.waiting[0] == snap.id)
                ):
                    await e.changed.wait()
            finally:
                e.waiting.remove(snap.id)
            if e.snapshot != snap.id:
                self._load(e, snap)
            e.inflight += 1
            e.changed.notify_all()

    async def _release(self, e: _Engine) -> None:
        async with e.changed:
            e.inflight -= 1
            e.changed.notify_all()

    def _load(self, e: _Engine, snap: Snapshot) -> None:
        if snap.adapter is not None:
            check_adapter(e.engine.model, snap.adapter)
            e.engine.update_weights(snap.adapter, e.engine.version + 1)
            e.adapter_bytes = sum(t.numel() * t.element_size() for t in snap.adapter.values())
            self.published_bytes += e.adapter_bytes
        e.snapshot = snap.id


def _seeds(seed: int | None, n: int) -> list[int]:
    """One noise seed per sample: given a seed, the same samples every time."""
    if seed is None:
        return [secrets.randbits(63) for _ in range(n)]
    rng = np.random.default_rng(seed & _U63)
    return [int(s) for s in rng.integers(0, _U63, size=n)]


def _scoring(prompt: list[int]) -> GenerationRequest:
    """The prompt's own tokens, forced, each with its log-prob after the tokens before it
    (temperature 1: the model's log-softmax)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=max(len(prompt) - 1, 1))
    return GenerationRequest(prompt[:1], replace(params), 0, forced_ids=prompt[1:])


MAX_SAMPLES = 256  # num_samples of one call


def ask_for(req: Any, tokenizer: Any, context: int) -> Ask:
    """A ``SampleRequest``'s prompt and parameters, checked (ValueError names the field)."""
    unsupported = [
        f
        for f in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")
        if getattr(req, f)
    ] + (["target_prompt_logprobs"] if req.target_prompt_logprobs is not None else [])
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)}: not served (prompt_logprobs is)")
    prompt: list[int] = []
    for i, chunk in enumerate(req.prompt.chunks):
        if getattr(chunk, "type", None) != "encoded_text":
            raise ValueError(f"prompt.chunks[{i}]: only encoded_text chunks are served")
        prompt += [int(t) for t in chunk.tokens]
    vocab = len(tokenizer)
    if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
        raise ValueError(f"prompt: needs at least one token, every id in [0, {vocab})")
    if len(prompt) >= context:
        raise ValueError(
            f"prompt: {len(prompt)} tokens leave no room in the {context}-token context"
        )
    if not 1 <= req.num_samples <= MAX_SAMPLES:
        raise ValueError(f"num_samples: expected 1 to {MAX_SAMPLES}, got {req.num_samples}")
    return Ask(
        prompt,
        req.num_samples,
        _params(req.sampling_params, tokenizer, context - len(prompt)),
        req.sampling_params.seed,
        bool(req.prompt_logprobs),
    )


def _params(p: Any, tokenizer: Any, room: int) -> SamplingParams:
    stop, stop_ids = [], []
    if p.stop is None:  # the model's end of sequence
        stop_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    elif isinstance(p.stop, str):
        stop = [p.stop]
    else:
        stop = [s for s in p.stop if isinstance(s, str)]
        stop_ids = [int(s) for s in p.stop if not isinstance(s, str)]
    if p.max_tokens is not None and p.max_tokens < 1:
        raise ValueError(f"sampling_params.max_tokens: expected >= 1, got {p.max_tokens}")
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise ValueError(f"sampling_params.temperature: expected >= 0, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        raise ValueError(f"sampling_params.top_p: expected in (0, 1], got {p.top_p}")
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=max(p.top_k, 0),
        max_new_tokens=min(p.max_tokens or room, room),
        stop=stop,
        stop_token_ids=stop_ids,
    )

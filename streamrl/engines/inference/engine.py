"""LocalEngine: the built-in inference engine (transformers model, our own decoding).

One scheduler step (:meth:`LocalEngine._step`) is the unit everything hangs on:

1. apply pending weights (from :meth:`update_weights`, any thread), bump ``version``;
2. admit pending requests (FIFO) into free slots;
3. one forward pass decodes the next token of every active slot and prefills
   the newly admitted prompts (whose first token comes from their last prompt
   position), see :mod:`streamrl.engines.inference.kv_cache`;
4. sample every row (:mod:`streamrl.engines.inference.sampling`) and record token,
   behaviour log-prob and weight version; finished sequences release their
   slot, which the next step's admission refills. A request with ``forced_ids``
   (scoring a known continuation) takes its given tokens instead, each with its
   log-prob under the same sampling distribution. Its prefill feeds the forced
   tokens too, so the whole continuation is scored in the step that admits it
   (:meth:`LocalEngine._scored_in_prefill`); a forced token that a stop string could
   end on is instead taken one step at a time, like a sampled one.

Steps are serialised by a lock and are the only place the model runs, so a
weight update lands exactly between two tokens: a sequence in flight keeps its
KV cache and simply continues with the new weights (interruptible generation).

``generate`` drives steps on the calling thread until its requests are done (both calls
live in :mod:`streamrl.engines.inference.batching`, shared with the vLLM engine).
``agenerate`` enqueues and awaits a future; the first call on an event loop
starts a scheduler task that runs steps on the engine's single worker thread
(``run_in_executor``) while there is work, so the loop stays free for episodes
(rewards, tools) during a forward. Requests enqueued before the scheduler's
first step are admitted in enqueue order, exactly as ``generate`` admits its
list, hence identical results.
"""

from __future__ import annotations

import collections
import heapq
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np
import torch

from streamrl.core.types import GenerationRequest, GenerationResult
from streamrl.engines.inference.batching import StepEngine, stop_string_hit, stop_window
from streamrl.engines.inference.drawing import Drawing
from streamrl.engines.inference.fallback_runner import HFCacheRunner
from streamrl.engines.inference.fused_layers import fused_away, supports_fused
from streamrl.engines.inference.isolation import check_request
from streamrl.engines.inference.kv_cache import LlamaSlotRunner, Prefill, supports_fast_path
from streamrl.engines.inference.prefixes import plan_prefills
from streamrl.engines.inference.quantize import EngineWeights, pack_linears, pack_threads, repack
from streamrl.engines.inference.sampling import (
    context_key,
    fold_tokens,
    is_raw,
)
from streamrl.engines.threads import set_thread_torch_threads

_U64 = (1 << 64) - 1
# drive() leaves cheaper steps to the engine's own thread (see drive): SmolLM2's decode
# steps take ~80-150 ms on this CPU, the tiny main job's ~5 ms
DRIVE_MIN_STEP_S = 0.02


@dataclass
class EngineStats:
    """Counters since construction (read them as deltas around a call)."""

    prefill_steps: int = 0  # steps that prefilled newly admitted prompts
    prefill_tokens: int = 0  # prompt tokens computed (excluding reused prefixes)
    decode_steps: int = 0  # steps that decoded active slots (one forward per step)
    tokens_generated: int = 0  # tokens returned to callers
    requests_finished: int = 0
    requests_failed: int = 0  # failed alone: bad parameters or tokens, NaN logits
    slot_refills: int = 0  # admissions into a slot that served an earlier request
    weight_updates: int = 0
    prefix_tokens_reused: int = 0  # prompt tokens whose KV was copied from another slot
    step_seconds: float = 0.0  # wall time inside steps (forward + sampling + bookkeeping)
    driven_steps: int = 0  # steps another thread ran (drive), e.g. the waiting trainer's


@dataclass
class _Seq:
    """A request in flight: where it sits and what it has produced so far."""

    request: GenerationRequest
    on_done: Callable[[GenerationResult | BaseException], None]
    slot: int = -1
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop_window: int = 0  # tokens to decode when checking stop strings (0 = none)
    scored: int = 0  # forced tokens scored in the prefill, before the last (its own row)

    @property
    def prefill_ids(self) -> list[int]:
        """What the admitting step feeds: the prompt, then the forced tokens it scores."""
        forced = self.request.forced_ids or []
        return self.request.prompt_ids + forced[: self.scored]


def copy_named(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], state_dict: dict[str, torch.Tensor]
) -> None:
    """``model.load_state_dict(state_dict, strict=False)`` through ``tensors`` (the model's
    own, by name): names it lacks are ignored; a shape that differs is an error, raised
    before anything is copied."""
    wrong = [
        f"{k}: {list(v.shape)}, expected {list(tensors[k].shape)}"
        for k, v in state_dict.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    if wrong:
        raise RuntimeError(f"weights of {type(model).__name__} do not fit: {'; '.join(wrong[:3])}")
    with torch.no_grad():
        for k, v in state_dict.items():
            if k in tensors:
                tensors[k].copy_(v)


class LocalEngine(Drawing, StepEngine):
    """Batched KV-cache inference with continuous batching over ``decode_slots`` slots.

    model:          a transformers causal LM; Llama-family models take the fast
                    slot path (see :mod:`streamrl.engines.inference.kv_cache`), others the
                    per-slot Hugging Face cache fallback.
    tokenizer:      only needed for ``stop`` strings.
    max_seq_len:    prompt + generated tokens per sequence; defaults to the model's
                    ``max_position_embeddings``. KV buffers grow lazily up to it.
    version:        weight version stamped on tokens until the first update.
    weights:        "float16" runs every linear layer on packed fp16 weights, "onednn"
                    on fp32 weights in oneDNN's layout (CPU, fp32 models; see
                    :mod:`streamrl.engines.inference.quantize`), re-packed after each weight
                    update; "float32" (default) uses the model as is.
    fuse_layers:    Llama-family decoder layers run with fused projections
                    (:mod:`streamrl.engines.inference.fused_layers`); False runs the model's own
                    layer modules (the reference the fused path is tested against).
                    None (default): fused on the CPU, where it was measured to pay; on
                    other devices the fused copies (+50% of the layer weights in fp32)
                    are unmeasured, so they are off unless asked for.
    compile_decode: ``torch.compile`` the steps that only decode, from the step plan to
                    the drawn tokens (``rollout.compile``, ``LlamaSlotRunner.decode_all``);
                    steps that prefill stay eager. It needs the
                    fused layers, and pays where a step is bound by per-op overhead
                    (small models; see ``benchmarks/results/engine.md``).
    batch_invariant: a request's tokens and log-probs do not depend on what else the step
                    batched with it, nor on when it arrived (``rollout.batch_invariant``;
                    :mod:`streamrl.engines.invariant`): its products run on padded rows and
                    its prompt's attention on the decode rows' kernel. The per-slot
                    fallback (non-Llama models) computes every slot alone, so it is
                    batch-invariant either way. Not with ``compile_decode``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        decode_slots: int = 32,
        max_seq_len: int | None = None,
        device: str | torch.device = "cpu",
        version: int = 0,
        weights: EngineWeights = "float32",
        fuse_layers: bool | None = None,
        compile_decode: bool = False,
        batch_invariant: bool = False,
    ) -> None:
        if decode_slots < 1:
            raise ValueError(f"decode_slots must be >= 1, got {decode_slots}")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.decode_slots = decode_slots
        self.max_seq_len = int(
            max_seq_len or getattr(model.config, "max_position_embeddings", 2048)
        )
        self.version = version
        self.stats = EngineStats()
        self.fast_path = supports_fast_path(model, self.max_seq_len)
        self.compiled = compile_decode
        self.batch_invariant = batch_invariant
        if fuse_layers is None:
            fuse_layers = self.device.type == "cpu"
        fuse = self.fast_path and fuse_layers and supports_fused(model)
        self._check_compile(model, fuse)
        self.runner: LlamaSlotRunner | HFCacheRunner = self._build_runner(model, weights, fuse)
        self._vocab = model.get_input_embeddings().num_embeddings  # valid token ids
        # hook called at every step boundary (tests, metrics); may call update_weights
        self.on_step: Callable[[LocalEngine], None] | None = None
        self._tensors_by_name: dict[str, torch.Tensor] | None = None  # see _named_tensors
        self._init_slots(decode_slots)
        self._queue_lock = threading.Lock()  # _pending
        self._init_steps()
        self._undriven = threading.Event()  # clear while another thread drives (drive)
        self._recent_steps: collections.deque[float] = collections.deque(maxlen=32)
        self._undriven.set()

    def _check_compile(self, model: torch.nn.Module, fuse: bool) -> None:
        """``compile_decode`` only where it is built: CPU, fused layers, not invariant."""
        if not self.compiled:
            return
        if self.device.type != "cpu":
            raise ValueError(
                f"compile_decode is built and measured for the CPU engine, not {self.device}"
            )
        if self.batch_invariant:
            raise ValueError("compile_decode cannot be batch-invariant (rollout.batch_invariant)")
        if not fuse:
            raise ValueError(
                f"compile_decode needs the engine's fused Llama-family decoder layers; "
                f"{type(model).__name__} runs "
                + ("its own layer modules" if self.fast_path else "the per-slot fallback")
            )

    def _build_runner(
        self, model: torch.nn.Module, weights: EngineWeights, fuse: bool
    ) -> LlamaSlotRunner | HFCacheRunner:
        """Pack the linear layers as ``weights`` asks, then the runner that steps the
        model: the Llama-family slot runner, or the per-slot Hugging Face fallback."""
        # FBGEMM's fp16 packing runs on every core this process may use (weight updates
        # re-pack every layer: ~1.4 s for SmolLM2 on one core), one torch thread each: the
        # pool is the parallelism, and no OpenMP team outlives a load (engines/threads.py)
        n = pack_threads() if weights != "float32" else 1
        self._packer = (
            ThreadPoolExecutor(n, "streamrl-pack", set_thread_torch_threads, (1,))
            if n > 1
            else None
        )
        skip = fused_away(model) if fuse else ()
        # the packing ("" for plain fp32 weights)
        self.packed = weights if pack_linears(model, weights, skip, self._packer) else ""
        if not self.fast_path:
            return HFCacheRunner(model, self.decode_slots, self.max_seq_len)
        return LlamaSlotRunner(
            model,
            self.decode_slots,
            self.max_seq_len,
            fuse=fuse,
            packed=self.packed,
            compile_decode=self.compiled,
            batch_invariant=self.batch_invariant,
        )

    def _init_slots(self, s: int) -> None:
        """The ``s`` decode slots, all free, and their per-slot sampling state."""
        self._slots: list[_Seq | None] = [None] * s
        self._free = list(range(s))  # min-heap: lowest free slot first keeps [0:n] dense
        self._used = [False] * s
        self._pending: collections.deque[_Seq] = collections.deque()
        # per-slot sampling state, written at admission
        self._next_tok = torch.zeros(s, dtype=torch.long, device=self.device)
        self._temp = torch.ones(s, dtype=torch.float32, device=self.device)
        self._top_k = torch.zeros(s, dtype=torch.long, device=self.device)
        self._top_p = torch.ones(s, dtype=torch.float32, device=self.device)
        # noise key: the request's seed, or for a stratified one (GenerationRequest.stratum)
        # a hash of seed, prompt and tokens so far, shared by the members of its group that
        # share its context; its uniforms are then shifted by j/G
        self._seed = np.zeros(s, dtype=np.uint64)
        self._count = np.zeros(s, dtype=np.uint64)  # tokens generated so far = noise counter
        self._shift = np.zeros(s, dtype=np.float64)
        self._stratified = np.zeros(s, dtype=bool)
        self._greedy_cpu = torch.zeros(s, dtype=torch.bool)
        # True where the sampling distribution is softmax(raw logits) or greedy
        self._raw = [True] * s

    # ------------------------------------------------------------------ public API
    @property
    def num_active(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ scheduling
    def _enqueue(self, items: list[tuple[GenerationRequest, Callable[..., None]]]) -> None:
        seqs = []
        for req, on_done in items:
            try:
                check_request(req, self._vocab, self.tokenizer)
            except (ValueError, TypeError) as exc:  # this request fails, alone
                self.stats.requests_failed += 1
                on_done(exc)
                continue
            seqs.append(_Seq(req, on_done, stop_window=stop_window(req.params.stop)))
        with self._queue_lock:
            self._pending.extend(seqs)

    def _has_work(self) -> bool:
        return bool(self._pending) or any(s is not None for s in self._slots)

    def drive(
        self, threads: int, until: Callable[[], bool], min_step_s: float | None = None
    ) -> int:
        """Runs this engine's steps on the calling thread, with ``threads`` torch threads,
        until ``until()`` is true, the engine has no work or it is paused; the scheduler's
        thread waits meanwhile. Returns the steps run.

        Only steps that cost at least ``min_step_s`` (default ``DRIVE_MIN_STEP_S``; the
        median of the last 32 steps, on either thread) are driven, so an engine that has
        not stepped yet is not driven (0 drives regardless). Cheaper steps are
        mostly Python, which holds the GIL, so a second core cannot speed them up (the
        tiny main job, driving its ~5 ms steps: 28.5 s of waits in 200 RL steps, the
        same as without).

        For a thread whose cores would idle otherwise: the trainer's, while it waits for a
        batch (``runtime.lend_cores``). The steps run on the calling thread's own OpenMP
        team, so the process keeps a single team (``engines/threads.py``: libgomp stops
        spinning at its barriers once it manages more threads than there are cores). A
        step's numbers depend on its thread count: with another count than the engine's
        own, runs that drive are not bit-reproducible."""
        before, n = torch.get_num_threads(), 0
        self._undriven.clear()
        try:
            torch.set_num_threads(threads)
            while self._resumed.is_set() and self._has_work() and not until():
                if not self.worth_driving(min_step_s):
                    break
                self._step()
                n += 1
        finally:
            torch.set_num_threads(before)
            self._undriven.set()
            self.stats.driven_steps += n
        return n

    def worth_driving(self, min_step_s: float | None = None) -> bool:
        """Whether :meth:`drive` would run steps: the median of the last 32 steps costs at
        least ``min_step_s`` (default ``DRIVE_MIN_STEP_S``; 0: always). With no step on
        record the cost is unknown, and it is not."""
        floor = DRIVE_MIN_STEP_S if min_step_s is None else min_step_s
        recent = tuple(self._recent_steps)  # one C call under the GIL: a consistent copy
        return floor <= 0 or (bool(recent) and median(recent) >= floor)

    def _scheduled_step(self) -> None:
        """A step on the scheduler's thread, once no other thread drives the engine."""
        self._undriven.wait()
        self._step()

    def _step_body(self) -> None:
        """One scheduler step (see the module docstring), under the step lock."""
        if self.on_step is not None:
            self.on_step(self)
        self._apply_staged()
        self._forward_and_sample()

    def _stepped(self, seconds: float) -> None:
        self.stats.step_seconds += seconds
        self._recent_steps.append(seconds)

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            copy_named(self.model, self._named_tensors(state_dict.keys()), state_dict)
            if self.packed:  # only the layers whose weights arrived
                repack(self.model, state_dict.keys(), self._packer)
            self.runner.weights_loaded(state_dict.keys(), self._packer)
        self.version = version
        self.stats.weight_updates += 1

    def _named_tensors(self, names: Any) -> dict[str, torch.Tensor]:
        """The model's tensors by state-dict name (parameters and buffers, as the model's
        own), built once: a publish then costs its tensors' copies, not a walk over every
        module (which dominates an adapter's few megabytes on a model of many modules).
        Rebuilt if a name arrives that it lacks."""
        cached = self._tensors_by_name
        if cached is None or any(n not in cached for n in names):
            cached = self._tensors_by_name = dict(self.model.state_dict(keep_vars=True))
        return cached

    def _forward_and_sample(self) -> None:
        """Decodes every active slot and prefills newly admitted requests in one forward.

        A failure of the forward fails every request in it (``_step``); one that belongs
        to a request (its sampling, its forced tokens, its stop strings) fails that
        request alone, and the others go on as if it had not been there."""
        decoding = [q for q in self._slots if q is not None]  # ascending slot order
        admitted = self._admit()
        if not decoding and not admitted:
            return
        seqs = decoding + admitted
        slots = [q.slot for q in seqs]
        self.stats.decode_steps += bool(decoding)
        drawn = None  # (tokens, log-probs) drawn inside the compiled graph
        if self.compiled and not admitted:  # one graph from the step plan to drawn tokens
            logits, tokens, token_lp = self.runner.decode_all(  # type: ignore[union-attr]
                self._next_tok, self._noise(slice(None)), self._greedy_cpu
            )  # every slot's rows: keep the decoding ones'
            if len(slots) < self.decode_slots:
                slot_t = torch.tensor(slots, device=self.device)
                logits, tokens, token_lp = logits[slot_t], tokens[slot_t], token_lp[slot_t]
            if all(self._raw[s] for s in slots):  # the graph's draw is the one for raw rows
                drawn = (tokens, token_lp)
        else:
            prefills = self._plan_prefills(decoding, admitted)
            logits = self.runner.step(
                [q.slot for q in decoding], self._next_tok, prefills
            )  # (len(seqs) + scored rows, V)
            if admitted:
                self.stats.prefill_steps += 1
                self.stats.prefill_tokens += sum(len(f.prompt) - f.shared for f in prefills)
                self.stats.prefix_tokens_reused += sum(f.shared for f in prefills)
            if len(logits) > len(seqs):  # forced tokens scored in their prefill
                self._record_scored(admitted, logits[len(seqs) :])
                logits = logits[: len(seqs)]
                live = [i for i, q in enumerate(seqs) if self._slots[q.slot] is q]
                if len(live) < len(seqs):  # some failed scoring their forced tokens
                    seqs, slots = [seqs[i] for i in live], [slots[i] for i in live]
                    logits = logits[torch.tensor(live, device=self.device)]
        tokens_l, lps, failed = self._draw_isolated(seqs, logits, drawn)
        for i, exc in failed.items():
            self._fail(seqs[i], exc)
        ok = [i for i, q in enumerate(seqs) if i not in failed and self._slots[q.slot] is q]
        if not ok:
            return
        slots = [slots[i] for i in ok]
        drawn_ids = [tokens_l[i] for i in ok]
        self._next_tok[torch.tensor(slots, device=self.device)] = torch.tensor(
            drawn_ids, device=self.device
        )
        self._count[slots] += np.uint64(1)
        folding = self._stratified[slots]
        if folding.any():
            at = np.asarray(slots)[folding]
            self._seed[at] = fold_tokens(self._seed[at], np.asarray(drawn_ids)[folding])
        for i, tok in zip(ok, drawn_ids, strict=True):
            self._record(seqs[i], tok, lps[i])

    def _scored_in_prefill(self, q: _Seq) -> int:
        """How many of ``q``'s forced tokens its prefill scores before its last row.

        The forced tokens are those the one-token-at-a-time path would take: up to
        ``max_new_tokens``, the engine's ``max_seq_len``, and the first stop token.
        Stop strings end on decoded text, so a request with them is not scored ahead.
        """
        forced, p = q.request.forced_ids, q.request.params
        if not forced or p.stop:
            return 0
        n = min(len(forced), p.max_new_tokens, self.max_seq_len - len(q.request.prompt_ids))
        stops = set(p.stop_token_ids)
        n = next((i + 1 for i, t in enumerate(forced[:n]) if t in stops), n)
        return max(n - 1, 0)

    def _plan_prefills(self, decoding: list[_Seq], admitted: list[_Seq]) -> list[Prefill]:
        """For each new prompt, the slot sharing its longest prefix (:func:`plan_prefills`)."""
        if not self.runner.shares_prefixes:
            return [Prefill(q.slot, q.prefill_ids, scored=q.scored) for q in admitted]
        known = [(q.slot, q.request.prompt_ids + q.token_ids[:-1]) for q in decoding]
        return plan_prefills(known, [(q.slot, q.prefill_ids, q.scored) for q in admitted])

    def _admit(self) -> list[_Seq]:
        """Moves pending requests (FIFO) into free slots (lowest index first)."""
        admitted: list[_Seq] = []
        with self._queue_lock:
            while self._pending and self._free:
                seq = self._pending.popleft()
                if (
                    len(seq.request.prompt_ids) >= self.max_seq_len
                    or seq.request.params.max_new_tokens <= 0
                    or seq.request.forced_ids == []
                ):
                    self._finish(seq, "length")  # no room for a single token
                    continue
                seq.slot = heapq.heappop(self._free)
                seq.scored = self._scored_in_prefill(seq)
                admitted.append(seq)
        for seq in admitted:
            s, p = seq.slot, seq.request.params
            self.stats.slot_refills += self._used[s]
            self._used[s] = True
            self._slots[s] = seq
            self._temp[s] = p.temperature
            self._top_k[s] = p.top_k
            self._top_p[s] = p.top_p
            self._seed[s] = seq.request.seed & _U64
            stratum = seq.request.stratum
            self._stratified[s] = stratum is not None
            if stratum is not None:  # keyed on the context, shifted by j/G
                self._seed[s] = context_key(self._seed[s], seq.request.prompt_ids)
            self._shift[s] = 0.0 if stratum is None else stratum[0] / stratum[1]
            self._greedy_cpu[s] = p.temperature <= 0
            self._raw[s] = is_raw(p.temperature, p.top_k, p.top_p)
            self._count[s] = 0
        return admitted

    def _record(self, q: _Seq, token: int, logprob: float) -> None:
        q.token_ids.append(token)
        q.logprobs.append(logprob)
        q.versions.append(self.version)
        self.stats.tokens_generated += 1
        p = q.request.params
        try:  # decoding this request's tokens may fail: it fails alone
            stop = token in p.stop_token_ids or bool(q.stop_window and self._hit_stop_string(q))
        except Exception as exc:
            self._fail(q, exc)
            return
        if stop:
            self._release(q, "stop")
        elif (
            len(q.token_ids) >= p.max_new_tokens
            or (q.request.forced_ids is not None and len(q.token_ids) >= len(q.request.forced_ids))
            or len(q.request.prompt_ids) + len(q.token_ids) >= self.max_seq_len
        ):
            self._release(q, "length")

    def _hit_stop_string(self, q: _Seq) -> bool:
        """Decodes only the last few tokens: a stop string completed by this token ends in them."""
        return stop_string_hit(self.tokenizer, q.token_ids, q.request.params.stop, q.stop_window)

    def _release(self, q: _Seq, reason: str) -> None:
        s = q.slot
        self.runner.release(s)
        self._slots[s] = None
        heapq.heappush(self._free, s)
        self._finish(q, reason)

    def _fail(self, q: _Seq, exc: BaseException) -> None:
        """Fails ``q`` alone: its slot is freed and its caller gets ``exc``."""
        if q.slot >= 0 and self._slots[q.slot] is q:
            self.runner.release(q.slot)
            self._slots[q.slot] = None
            heapq.heappush(self._free, q.slot)
        self.stats.requests_failed += 1
        q.on_done(exc)

    def _finish(self, q: _Seq, reason: str) -> None:
        self.stats.requests_finished += 1
        q.on_done(
            GenerationResult(
                prompt_ids=list(q.request.prompt_ids),
                token_ids=q.token_ids,
                logprobs=q.logprobs,
                versions=q.versions,
                finish_reason=reason,
            )
        )

    def _fail_all(self, exc: BaseException) -> None:
        with self._queue_lock:
            pending, self._pending = list(self._pending), collections.deque()
        for q in [q for q in self._slots if q is not None]:
            with torch.inference_mode():  # the slot buffers are inference tensors
                self.runner.release(q.slot)
            self._slots[q.slot] = None
            heapq.heappush(self._free, q.slot)
            q.on_done(exc)
        for q in pending:
            q.on_done(exc)

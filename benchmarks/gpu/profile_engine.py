"""Where a decode step's time goes on a GPU: LocalEngine on a randomly initialised
model of SmolLM2-135M's shape (no weights needed), fp32 against bf16.

    python benchmarks/gpu/profile_engine.py --device cuda --out prof.txt
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine

SMOLLM2 = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
    tie_word_embeddings=True,
)  # fmt: skip


def run(engine: LocalEngine, n: int, new: int, seed: int) -> float:
    sp = SamplingParams(temperature=1.0, max_new_tokens=new)
    reqs = [GenerationRequest(list(range(1, 40)), sp, seed=seed + i) for i in range(n)]
    t0 = time.perf_counter()
    engine.generate(reqs)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**SMOLLM2)).eval()
    lines = []
    for dtype in (torch.float32, torch.bfloat16):
        model = base.to(args.device, dtype)
        engine = LocalEngine(model, decode_slots=args.batch, max_seq_len=256, device=args.device)
        run(engine, args.batch, 8, 0)  # warm-up
        secs = run(engine, args.batch, args.new, 1)
        steps = engine.stats.decode_steps
        lines.append(f"{dtype}: {args.batch * args.new / secs:.0f} tok/s, {secs:.2f} s")
        acts = [torch.profiler.ProfilerActivity.CPU]
        if args.device.startswith("cuda"):
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            run(engine, args.batch, 16, 2)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        lines.append(f"--- {dtype}, {steps} decode steps so far; by self CPU time\n{table}")
        print(lines[-2], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""Adapter-only publish vs a full-weight publish to the built-in inference engine.

What a Tinker sampling client's switch to a new snapshot costs (``Samplers._load`` in
``streamrl.stream.endpoint.tinker.sampling``): the engine that serves a LoRA run over the
shared frozen base receives only the adapter's tensors. The baseline is what a run
without adapters would publish: every weight of the model, into an engine of the same
base. Both engines are built in this process, side by side; each publish is a fresh
perturbed copy (made outside the timed region) loaded with ``update_weights``; the table
gives the bytes moved and the median / p90 latency over ``--repeats``, and the ratio.

Example:
  PYTHONPATH=. python benchmarks/bench_tinker_publish.py --model smollm2-135m-instruct \\
      --ranks 8 32 --repeats 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from streamrl.engines.inference.engine import LocalEngine
from streamrl.models.loading import load_model_and_tokenizer
from streamrl.stream.endpoint.tinker.adapters import LoraSpec, adapter_state, with_adapter
from streamrl.stream.endpoint.tinker.bases import share


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def perturbed(state: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return {k: v + 1e-4 * (i + 1) for k, v in state.items()}


def time_publishes(engine: LocalEngine, state: dict[str, torch.Tensor], repeats: int) -> list:
    seconds = []
    for i in range(repeats):
        fresh = perturbed(state, i)
        t0 = time.perf_counter()
        engine.update_weights(fresh, engine.version + 1)
        seconds.append(time.perf_counter() - t0)
    return seconds


def summary(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    base, tokenizer = load_model_and_tokenizer(args.model)
    base.requires_grad_(False)
    full_model = share(base)
    full_engine = LocalEngine(full_model, tokenizer, fuse_layers=False)
    full_state = {k: v.detach().clone() for k, v in full_model.state_dict().items()}
    full_s = summary(time_publishes(full_engine, full_state, args.repeats))
    full_engine.close()
    rows = [("full weights", nbytes(full_state), *full_s)]
    for rank in args.ranks:
        model = with_adapter(base, LoraSpec(rank=rank, alpha=32.0)).requires_grad_(False)
        engine = LocalEngine(model, tokenizer, fuse_layers=False)
        rows.append(
            (
                f"adapter r={rank}",
                nbytes(adapter_state(model)),
                *summary(time_publishes(engine, adapter_state(model), args.repeats)),
            )
        )
        engine.close()
    print(f"model {args.model}, {args.repeats} publishes each, torch threads 1\n")
    print("| publish | bytes | median s | p90 s | bytes vs full | median vs full |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, size, med, p90 in rows:
        print(
            f"| {name} | {size:,} | {med:.4f} | {p90:.4f} | "
            f"{size / rows[0][1]:.4f} | {med / rows[0][2]:.4f} |"
        )


if __name__ == "__main__":
    main()

"""Can the rollout engine's fp16 decode step use a second core?

FBGEMM's fp16-weight kernel (``rollout.engine_weights=float16``) runs on one thread. A
decode step reads its weights, so a second core helps only if each core reads a part of
every layer's weight: split every linear layer's output rows in two, and run the second
half on another thread. That adds a hand-off per layer (132 a SmolLM2 decode step, the vocabulary head in 12 blocks).

This times, over the linear layers of one SmolLM2 decode step at M rows (random weights
of the engine's shapes, from ``bench_linear_rows.py``), interleaved:
- ``whole``: every layer on the calling thread, as the engine runs today;
- ``split``: every layer's second half of output rows on a TorchScript fork (the
  inter-op pool: the cheapest hand-off torch offers without a C++ extension);
- ``two steps at once``: two whole steps on two Python threads, which is the throughput
  a second core adds when nothing has to be handed off;
and the cost of one fork plus wait of a function that does nothing.

    PYTHONPATH=. python benchmarks/bench_linear_split.py --rows 16 --repeats 40
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from benchmarks.bench_linear_rows import shapes

Packed = torch.classes.quantized.LinearPackedParamsBase  # type: ignore[attr-defined]


@torch.jit.script
def _linear(x: torch.Tensor, p: Packed) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x, p)


@torch.jit.script
def _split_linear(x: torch.Tensor, a: Packed, b: Packed) -> torch.Tensor:
    other = torch.jit.fork(_linear, x, b)
    return torch.cat([torch.ops.quantized.linear_dynamic_fp16(x, a), torch.jit.wait(other)], 1)


@torch.jit.script
def _nothing(x: torch.Tensor) -> torch.Tensor:
    return x


@torch.jit.script
def _fork_wait(x: torch.Tensor) -> torch.Tensor:
    return torch.jit.wait(torch.jit.fork(_nothing, x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(2)
    torch.manual_seed(0)
    pack = torch.ops.quantized.linear_prepack_fp16
    weights = [torch.randn(o, i) * 0.02 for o, i in shapes()]
    whole = [pack(w, None) for w in weights]
    halves = [(pack(w[: len(w) // 2].contiguous(), None), pack(w[len(w) // 2 :].contiguous(), None)) for w in weights]  # fmt: skip
    xs = [torch.randn(args.rows, w.shape[1]) for w in weights]
    ref = _linear(xs[0], whole[0])
    assert torch.equal(ref, _split_linear(xs[0], *halves[0])), "the split must be exact"

    def run_whole() -> None:
        for x, p in zip(xs, whole, strict=True):
            _linear(x, p)

    def run_split() -> None:
        for x, (a, b) in zip(xs, halves, strict=True):
            _split_linear(x, a, b)

    def run_two() -> None:
        t = threading.Thread(target=run_whole)
        t.start()
        run_whole()
        t.join()

    runs = {"whole": run_whole, "split": run_split, "two steps at once": run_two}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    x = torch.zeros(1)
    hand_off = []
    for _ in range(1000):
        t0 = time.perf_counter()
        _fork_wait(x)
        hand_off.append(time.perf_counter() - t0)
    base = statistics.median(times["whole"])
    print(
        f"SmolLM2 decode-step linear layers, fp16 weights, {args.rows} rows, {len(weights)} layers"
    )
    print("| run | median ms | steps per second vs whole |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        steps = 2 if name == "two steps at once" else 1
        print(f"| {name} | {med * 1e3:.1f} | {steps * base / med:.2f}x |")
    print(f"fork + wait of nothing: {statistics.median(hand_off) * 1e6:.0f} us (median of 1000)")


if __name__ == "__main__":
    main()

"""The fp32 matrix products of one SmolLM2 decode step at 16 rows, by four CPU kernels.

A decode step of the fp32 engine is mostly its linear layers: 30 decoder layers of fused
Q/K/V, output, fused gate/up and down projections, then the vocabulary head. Their
shapes are SmolLM2-135M's, with random weights (one copy per layer, so the step reads
~540 MB as the engine does). Each kernel runs the whole set once per repeat:

  mkl     ``F.linear``, what the engine and ``generate`` run (MKL's sgemm)
  packed  MKL's packed-weight GEMM, as inductor's freezing pass uses it
          (``torch.ops.mkl._mkl_reorder_linear_weight`` once, then ``_mkl_linear``)
  onednn  oneDNN, through ``torch.utils.mkldnn.MkldnnLinear`` (the input converted to
          and from oneDNN's format at every call)
  reordered  oneDNN on weights reordered once for ``--rows`` rows
          (``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``), as
          ``rollout.engine_weights=onednn`` runs them

    PYTHONPATH=. python benchmarks/bench_fp32_gemm.py --rows 16 --repeats 7 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils import mkldnn

HIDDEN, INTER, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
SHAPES = [(HIDDEN, HIDDEN + 2 * KV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]


def median_ms(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all kernels")
    args = ap.parse_args()
    torch.set_num_threads(1)
    m = args.rows
    linears = [[torch.nn.Linear(i, o, bias=False) for i, o in SHAPES] for _ in range(LAYERS)] + [
        [torch.nn.Linear(HIDDEN, VOCAB, bias=False)]
    ]
    weights = [lin.weight.detach() for layer in linears for lin in layer]
    x = {HIDDEN: torch.randn(m, HIDDEN), INTER: torch.randn(m, INTER)}
    with torch.no_grad():
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]
        dnnl = [mkldnn.MkldnnLinear(lin, torch.float32) for layer in linears for lin in layer]
        reordered = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in weights]

    def linear_pointwise(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def plain() -> None:
        for w in weights:
            F.linear(x[w.shape[1]], w)

    def mkl_packed() -> None:
        for w, p in zip(weights, packed, strict=True):
            torch.ops.mkl._mkl_linear(x[w.shape[1]], p, w, None, m)

    def onednn() -> None:
        for w, lin in zip(weights, dnnl, strict=True):
            lin(x[w.shape[1]].to_mkldnn()).to_dense()

    def onednn_reordered() -> None:
        for w, r in zip(weights, reordered, strict=True):
            linear_pointwise(x[w.shape[1]], r)

    kernels = {"mkl": plain, "packed": mkl_packed, "onednn": onednn, "reordered": onednn_reordered}
    with torch.no_grad():
        w = weights[2]
        ref = F.linear(x[HIDDEN], w)
        diff = {
            "packed": (torch.ops.mkl._mkl_linear(x[HIDDEN], packed[2], w, None, m) - ref),
            "onednn": (dnnl[2](x[HIDDEN].to_mkldnn()).to_dense() - ref),
            "reordered": (linear_pointwise(x[HIDDEN], reordered[2]) - ref),
        }
        print(" ".join(f"{k}: max |diff| {v.abs().max().item():.2e}" for k, v in diff.items()))
        results: dict[str, list[float]] = {k: [] for k in kernels}
        for r in range(args.rounds):
            for name, fn in kernels.items():
                results[name].append(median_ms(fn, args.repeats))
            print(
                f"[round {r + 1}] " + "  ".join(f"{k} {v[-1]:.1f} ms" for k, v in results.items())
            )
    gflop = 2 * m * sum(w.numel() for w in weights) / 1e9
    print(f"\n{m} rows, one thread, {gflop:.1f} GFLOP a step; median of rounds")
    print("| kernel | ms per step's products | GFLOP/s | vs mkl |\n|---|---|---|---|")
    base = statistics.median(results["mkl"])
    for name, ms in results.items():
        med = statistics.median(ms)
        print(f"| {name} | {med:.1f} | {gflop / med * 1000:.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()

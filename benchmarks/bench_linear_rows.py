"""Is a SmolLM2 decode step bound by arithmetic or by reading its weights?

Times every linear layer of one SmolLM2-135M decode step (the engine's fused shapes:
Q/K/V together and gate/up together, for 30 layers, plus the 49k-row vocabulary head in
4096-row blocks) over M rows, with fp32 weights (MKL) and with FBGEMM's packed fp16
weights (``rollout.engine_weights=float16``), and with fp32 weights prepacked for
oneDNN (not used by streamrl; a candidate). Random weights of the right shapes: no
model file is needed. For each M it prints milliseconds, GFLOP/s and the weight bytes
read per second, next to a streaming read of 200 MB (``torch.sum``), the memory
bandwidth a kernel could use.

If the time grows with M while GFLOP/s sits near the core's peak, the step is bound by
arithmetic; if the time stays flat as M grows, it is bound by reading the weights.

    PYTHONPATH=. python benchmarks/bench_linear_rows.py --rows 1 4 8 16 32 64
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

HIDDEN, INTER, LAYERS, VOCAB = 576, 1536, 30, 49152
QKV = HIDDEN + 2 * 192  # 9 query heads and 2 x 3 key/value heads of 64
BLOCK = 4096  # rows per packed block of the head, as streamrl.engines.inference.quantize


def shapes() -> list[tuple[int, int]]:
    """(out, in) of every matrix product one decode step runs."""
    layer = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    head = [(min(BLOCK, VOCAB - lo), HIDDEN) for lo in range(0, VOCAB, BLOCK)]
    return layer * LAYERS + head


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def onednn_seconds(xs: list, weights: list, rows: int, repeats: int) -> float:
    """The same fp32 products on weights prepacked for oneDNN at ``rows`` (nan when this
    torch has no oneDNN linear)."""
    try:
        ops = torch.ops.mkldnn
        packed = [ops._reorder_linear_weight(w, rows) for w in weights]
        pairs = list(zip(xs, packed, strict=True))
        return median_seconds(
            lambda: [ops._linear_pointwise(x, w, None, "none", [], "") for x, w in pairs], repeats
        )
    except (AttributeError, RuntimeError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    big = torch.randn(50_000_000)  # 200 MB
    read = median_seconds(big.sum, args.repeats)
    print(f"streaming read (torch.sum over 200 MB fp32): {200e6 / read / 1e9:.1f} GB/s")
    del big

    weights = [torch.randn(o, i) * 0.02 for o, i in shapes()]
    with warnings.catch_warnings():  # FBGEMM's quantized ops warn they are deprecated
        warnings.simplefilter("ignore")
        packed = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]
    params = sum(w.numel() for w in weights)
    print(
        f"{len(weights)} matrix products, {params / 1e6:.1f} M parameters; threads={args.threads}"
    )
    print(
        "| rows | fp32 ms | fp32 GFLOP/s | fp32 weight GB/s | fp16 ms | fp16 GFLOP/s"
        " | fp16 weight GB/s | fp32 oneDNN ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    fp16 = torch.ops.quantized.linear_dynamic_fp16
    for m in args.rows:
        xs = [torch.randn(m, w.shape[1]) for w in weights]
        pairs32, pairs16 = list(zip(xs, weights, strict=True)), list(zip(xs, packed, strict=True))
        t32 = median_seconds(lambda p=pairs32: [F.linear(x, w) for x, w in p], args.repeats)
        t16 = median_seconds(lambda p=pairs16: [fp16(x, w) for x, w in p], args.repeats)
        tdnn = onednn_seconds(xs, weights, m, args.repeats)
        flop = 2 * m * params
        print(
            f"| {m} | {1e3 * t32:.1f} | {flop / t32 / 1e9:.0f} | {4 * params / t32 / 1e9:.1f} |"
            f" {1e3 * t16:.1f} | {flop / t16 / 1e9:.0f} | {2 * params / t16 / 1e9:.1f} |"
            f" {1e3 * tdnn:.1f} |"
        )


if __name__ == "__main__":
    main()

"""The rollout engine's decode step on one torch thread against two (SmolLM2 or tiny).

While the trainer waits for a batch its core is idle; this measures what the engine
would gain from it. Each engine variant (fp32 and fp16 engine weights) generates the same
fixed-length batch (``--prompts`` prompts, ``--tokens`` new tokens each, one slot per
prompt) on one and then two threads, in interleaved rounds.

``--on-thread`` runs the engine as RL's local backend does: ``agenerate`` on the engine's
own step thread, whose torch thread count is set for that thread only. It then measures
three OpenMP states of the process, in this order (each changes the process for good):

* ``clean``: only the engine's thread has ever run a two-thread team;
* ``main-team``: the main thread has run one two-thread op first, as the trainer's
  evaluation before RL does, then gone back to one thread (libgomp keeps that team's
  worker);
* ``released``: the main thread then opened a one-thread parallel region through libgomp
  itself, meant to end that worker (measured: it does not bring the gain back).

Results and the likely cause: ``benchmarks/results/rl_step.md``, "Lending, measured
inside RL".

    PYTHONPATH=. python benchmarks/bench_engine_threads.py --prompts 16 --tokens 32 --rounds 2
    PYTHONPATH=. python benchmarks/bench_engine_threads.py --model tiny --tokens 128 --rounds 3
    PYTHONPATH=. python benchmarks/bench_engine_threads.py --on-thread --weights float16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import load_model, run_engine  # noqa: E402

from streamrl.core.types import GenerationRequest, SamplingParams  # noqa: E402
from streamrl.engines.inference.engine import LocalEngine  # noqa: E402


def on_thread(engine: LocalEngine, prompts: list[list[int]], tokens: int, threads: int) -> None:
    """Generates through ``agenerate``: the steps run on the engine's own thread, which
    computes with ``threads`` torch threads (set there only, as a per-thread count)."""
    engine.on_step = lambda e: torch.get_num_threads() != threads and torch.set_num_threads(threads)
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens)

    async def run() -> None:
        reqs = [GenerationRequest(p, params, seed=i) for i, p in enumerate(prompts)]
        await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    asyncio.run(run())


def main_thread_team() -> None:
    """One two-thread op on the main thread, then back to one thread."""
    torch.set_num_threads(2)
    torch.randn(2_000_000).exp_()
    torch.set_num_threads(1)


def release_main_team() -> None:
    """A one-thread parallel region opened on the main thread through libgomp, meant to
    end the workers the thread's earlier, larger team left behind."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    path = next(ln.split()[-1] for ln in maps if "libgomp" in ln)
    noop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: None)
    ctypes.CDLL(path).GOMP_parallel(noop, None, ctypes.c_uint(1), ctypes.c_uint(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--weights", nargs="+", default=["float32", "float16"])
    ap.add_argument("--on-thread", action="store_true", help="see the module docstring")
    args = ap.parse_args()
    model, _, pool, _ = load_model(args.model)
    prompts = [pool[i % len(pool)] for i in range(args.prompts)]
    max_len = max(map(len, prompts)) + args.tokens + 8
    torch.set_num_threads(1)
    engines = {
        w: LocalEngine(
            model if i == 0 else copy.deepcopy(model),
            decode_slots=args.prompts,
            max_seq_len=max_len,
            weights=w,
        )
        for i, w in enumerate(args.weights)
    }
    for engine in engines.values():  # warm-up
        run_engine(engine, prompts, [], 4, 10_000)
    states = ["clean", "main-team", "released"] if args.on_thread else ["main thread"]
    ms: dict[tuple[str, str, int], list[float]] = {}
    for state in states:
        if state == "main-team":
            main_thread_team()
        elif state == "released":
            release_main_team()
        for r in range(args.rounds):
            for w, engine in engines.items():
                for threads in (1, 2):
                    steps0, t0 = engine.stats.decode_steps, time.perf_counter()
                    if args.on_thread:
                        on_thread(engine, prompts, args.tokens, threads)
                    else:
                        torch.set_num_threads(threads)
                        run_engine(engine, prompts, [], args.tokens, 0)
                        torch.set_num_threads(1)
                    steps = engine.stats.decode_steps - steps0
                    ms.setdefault((state, w, threads), []).append(
                        1000 * (time.perf_counter() - t0) / steps
                    )
                    print(f"[{state}, round {r + 1}] {w}, {threads} thread(s): "
                          f"{ms[state, w, threads][-1]:.1f} ms/step")  # fmt: skip
    for engine in engines.values():
        engine.close()
    print(
        f"\n{args.model}, {args.prompts} rows, {args.tokens} tokens; median ms per decode step\n"
        "| steps on | engine weights | 1 thread | 2 threads | 2 / 1 |\n|---|---|---|---|---|"
    )
    for state in states:
        for w in engines:
            one = statistics.median(ms[state, w, 1])
            two = statistics.median(ms[state, w, 2])
            print(f"| {state} | {w} | {one:.1f} | {two:.1f} | {two / one:.2f}x |")


if __name__ == "__main__":
    main()

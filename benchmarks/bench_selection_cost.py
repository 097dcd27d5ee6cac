"""What the likelihood gate's scoring costs next to the groups it saves, on one engine.

``selection.kind=likelihood`` scores each candidate item (prompt + reference answer, one
teacher-forced request) before it decides whether to generate its group. It pays only
when the groups it saves cost more engine time than all the candidates it scores. This
script measures both sides on the run's own engine and sampling parameters, one thread
(a disaggregated rollout worker's core):

- ``score``: ``--candidates`` training items scored at once through
  :meth:`LikelihoodGate.choose` (one engine step, as the worker does);
- ``generate``: ``--groups`` items rolled out ``rollout.group_size`` times each through
  ``agenerate``, as the worker generates groups;
- ``forward``: one padded forward of the same candidates' prompt + reference through
  the plain transformers model, no engine: the compute floor of scoring.

It prints engine milliseconds per scored candidate and per generated group, and their
ratio: how many candidates cost one group. On the main job a group costs about 10
candidates (``benchmarks/results/selection.md``), and halving its dropped groups took
24-26 scored candidates per group avoided.

    PYTHONPATH=. python benchmarks/bench_selection_cost.py --run runs/default
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from pathlib import Path

import torch

from streamrl.config import load_config
from streamrl.core.types import GenerationRequest
from streamrl.engines.inference.engine import LocalEngine
from streamrl.models.loading import load_model_and_tokenizer
from streamrl.models.tokenizer import encode_prompt, reference_ids
from streamrl.rollout.episodes import sampling_params
from streamrl.rollout.selection.gate import LikelihoodGate
from streamrl.sources import build_task_source


def engine_ms(engine: LocalEngine, work) -> float:
    before = engine.stats.step_seconds
    asyncio.run(work())
    return 1e3 * (engine.stats.step_seconds - before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run (config + model)")
    ap.add_argument("--candidates", type=int, default=256)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.run / "config.yaml")
    model, tokenizer = load_model_and_tokenizer(str(args.run / "model"))
    model.eval()
    engine = LocalEngine(model, tokenizer)
    params = sampling_params(cfg.rollout, tokenizer)
    gate = LikelihoodGate(tokenizer, params, cfg.rollout.group_size, 0.5)
    source = build_task_source(cfg.data.kind, **cfg.data.options).train_iter(cfg.seed + 1)
    items = list(itertools.islice(source, args.candidates + args.groups))
    candidates, groups = items[: args.candidates], items[args.candidates :]
    g = cfg.rollout.group_size

    async def score() -> None:
        await gate.choose(engine, 0, candidates)

    async def generate() -> None:
        requests = [
            GenerationRequest(encode_prompt(tokenizer, it), params, seed=j)
            for it in groups
            for j in range(g)
        ]
        await asyncio.gather(*(engine.agenerate(r) for r in requests))

    rows = [encode_prompt(tokenizer, it) + reference_ids(tokenizer, it.answer) for it in candidates]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id or 0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])

    def forward_ms() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)
        return 1e3 * (time.perf_counter() - t0)

    engine_ms(engine, score), engine_ms(engine, generate), forward_ms()  # warm-up
    s, gen, fwd = [], [], []
    for _ in range(args.repeats):  # interleaved, so drift hits all three alike
        s.append(engine_ms(engine, score))
        gen.append(engine_ms(engine, generate))
        fwd.append(forward_ms())
    per_candidate = statistics.median(s) / len(candidates)
    per_group = statistics.median(gen) / len(groups)
    floor = statistics.median(fwd) / len(candidates)
    tokens = sum(map(len, rows)) / len(rows)
    print(f"run {args.run}: {len(candidates)} candidates ({tokens:.1f} tokens each), "
          f"{len(groups)} groups of {g}, median of {args.repeats}, 1 thread")  # fmt: skip
    print(f"  scoring:    {per_candidate:.3f} ms per candidate (engine)")
    print(f"  forward:    {floor:.3f} ms per candidate (padded transformers forward, the floor)")
    print(f"  generating: {per_group:.2f} ms per group (engine)")
    print(f"  one group costs {per_group / per_candidate:.1f} scored candidates "
          f"({per_group / floor:.1f} at the floor)")  # fmt: skip


if __name__ == "__main__":
    main()

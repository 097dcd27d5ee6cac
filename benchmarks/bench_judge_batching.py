"""A group's judge prompts as one batch (how the judged rewards ask) against one prompt at
a time, on the engine backend, side by side in one process.

``pairwise_judge`` with ``swap`` over a group of ``--group`` answers asks N(N-1) prompts;
the batch is one ``generate`` call (every prompt prefilled together, one forward per
token for all), the baseline calls ``generate`` once per prompt. Same replies either way
(greedy, up to the engine's batch-dependent rounding: the count of equal replies is
printed); the ratio is the wall time of the baseline over the batch's.

    PYTHONPATH=. python benchmarks/bench_judge_batching.py --model tiny-small --group 8
"""

from __future__ import annotations

import argparse
import time

from streamrl.rollout.rewards.arena import PAIR_TEMPLATE
from streamrl.rollout.rewards.judges import JudgeSpec, judge_backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-small")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = JudgeSpec(backend="engine", model=args.model, max_new_tokens=4, chat=False)
    backend = judge_backend(spec)
    answers = [f"{40 + 7 * k}" for k in range(args.group)]
    prompts = [
        PAIR_TEMPLATE.format(prompt="12+34=", a=a, b=b)
        for i, a in enumerate(answers)
        for j, b in enumerate(answers)
        if i != j
    ]
    backend.ask(prompts[:2])  # (warm-up)
    batched, single = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        together = backend.ask(prompts)
        batched.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        alone = [backend.ask([p])[0] for p in prompts]
        single.append(time.perf_counter() - t0)
        same = sum(x == y for x, y in zip(together, alone, strict=True))
    b, s = min(batched), min(single)
    print(
        f"{len(prompts)} prompts ({args.model}, group {args.group}, swap): one batch {b:.2f} s, "
        f"one at a time {s:.2f} s: {s / b:.1f}x (best of {args.repeats}); "
        f"equal replies {same}/{len(prompts)}"
    )


if __name__ == "__main__":
    main()

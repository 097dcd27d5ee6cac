"""How often a frozen judge model agrees with the true answer on 2-digit sums.

For ``--n`` seeded additions, half answered right and half off by 1, 2 or 10 (as a noisy
demonstration is), asks the judge (``rubric_judge``'s engine backend: greedy, batched)
with each prompt style below and reports: replies parsed, the share judged right ("yes"
or a score >= 5), and agreement with the truth. A judge that says the same thing to every
answer agrees on about half and teaches nothing.

    PYTHONPATH=. python benchmarks/bench_judge_agreement.py --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

from streamrl.rollout.rewards.judges import JudgeSpec, judge_backend
from streamrl.rollout.rewards.llm_judge import parse_judgement

SHOTS = [("57", "57", 1), ("83", "84", 0), ("120", "110", 0), ("66", "66", 1)]
STYLES = {  # name: (prompt, parse, chat)
    "chat_yes_no": (
        "Question: {q}\nReference answer: {ref}\nStudent answer: {r}\nIs the student answer "
        "the same number as the reference answer? Answer yes or no.",
        "yes_no",
        True,
    ),
    "chat_score": (
        "Question: {q}\nReference answer: {ref}\nStudent answer: {r}\nScore the student "
        "answer from 0 (wrong) to 10 (matches the reference). Reply with the number only.",
        "number",
        True,
    ),
    "fewshot_yes_no": (
        "".join(
            f"Reference: {a}\nAnswer: {b}\nMatch: {'yes' if v else 'no'}\n\n" for a, b, v in SHOTS
        )
        + "Reference: {ref}\nAnswer: {r}\nMatch:",
        "yes_no",
        False,
    ),
    "fewshot_score": (
        "".join(f"Reference: {a}\nAnswer: {b}\nScore: {10 if v else 0}\n\n" for a, b, v in SHOTS)
        + "Reference: {ref}\nAnswer: {r}\nScore:",
        "number",
        False,
    ),
}


def cases(n: int, seed: int) -> list[tuple[str, str, str, bool]]:
    rng, out = random.Random(seed), []
    for k in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        right = k % 2 == 0
        r = a + b if right else a + b + rng.choice([-10, -2, -1, 1, 2, 10])
        out.append((f"{a}+{b}=", str(a + b), str(r), right))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| style | parsed | judged right | agreement | seconds |\n|---|---|---|---|---|")
    for name, (template, parse, chat) in STYLES.items():
        spec = JudgeSpec(backend="engine", model=args.model, chat=chat, max_new_tokens=4)
        batch = cases(args.n, args.seed)
        t0 = time.perf_counter()
        replies = judge_backend(spec).ask(
            [template.format(q=q, ref=ref, r=r) for q, ref, r, _ in batch]
        )
        seconds = time.perf_counter() - t0
        scored = []
        for reply, (_, _, _, right) in zip(replies, batch, strict=True):
            with contextlib.suppress(ValueError):  # (an unparsed reply is left out)
                scored.append((parse_judgement(reply, parse, 0, 10) >= 0.5, right))
        said_right = sum(s for s, _ in scored)
        agree = sum(s == r for s, r in scored)
        n = max(len(scored), 1)
        print(
            f"| {name} | {len(scored)}/{len(batch)} | {said_right}/{len(scored)} | "
            f"{agree / n:.2f} | {seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

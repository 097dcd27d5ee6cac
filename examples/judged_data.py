"""Writes the data of ``examples/judged.yaml`` (run from the repository root):

- ``examples/data/judged_train.jsonl`` / ``judged_heldout.jsonl``: 2-digit additions
  (``"12+34="``, answer ``"46"``), each with its rubric (the criterion the judge checks);
- ``examples/data/verifier.jsonl``: the judge's own training data, every 2-digit addition
  but the held-out ones: ``"12+34=46?"`` with answer ``"46 yes"``, or a near miss (off
  by 1, 2 or 10, as a noisy demonstration is) with ``"46 no"``: the judge writes the sum
  before its verdict (a bare yes/no stayed at chance); half each.

Seeded: the same files every time. ``python examples/judged_data.py``
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path("examples/data")
RUBRIC = [{"criterion": "the sum is right", "weight": 1, "name": "correct"}]


def problems(rng: random.Random, n: int, seen: set[str]) -> list[tuple[str, int]]:
    out = []
    while len(out) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (p := f"{a}+{b}=") not in seen:
            seen.add(p)
            out.append((p, a + b))
    return out


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    rng, seen = random.Random(0), set()
    OUT.mkdir(parents=True, exist_ok=True)
    heldout = problems(rng, 200, seen)
    train = problems(rng, 3000, seen)
    write(
        OUT / "judged_heldout.jsonl",
        [{"prompt": p, "answer": s, "rubric": RUBRIC} for p, s in heldout],
    )
    write(
        OUT / "judged_train.jsonl", [{"prompt": p, "answer": s, "rubric": RUBRIC} for p, s in train]
    )
    verifier = []
    held = {p for p, _ in heldout}  # (the judge never sees the held-out problems)
    pairs = [(f"{a}+{b}=", a + b) for a in range(10, 100) for b in range(10, 100)]
    for p, s in (x for x in pairs if x[0] not in held):
        if rng.random() < 0.5:
            verifier.append({"prompt": f"{p}{s}?", "answer": f"{s} yes"})
        else:
            wrong = s + rng.choice([-10, -2, -1, 1, 2, 10])
            verifier.append({"prompt": f"{p}{wrong}?", "answer": f"{s} no"})
    write(OUT / "verifier.jsonl", verifier)


if __name__ == "__main__":
    main()

"""The curriculum sampler in whole runs: at η = 0 a run killed mid-way and resumed ends
with the weights, the books and the curriculum of the uninterrupted run (its levels,
stream positions, budgets' evidence and pending outcomes are in the pool's checkpoint),
and each step's metrics carry the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.integration.test_resume import _check_books, _full_and_killed

CURRICULUM = (
    "stream.max_staleness=0",
    "runtime.backend=local",
    "data.options={digits: 2, operators: '+', heldout_size: 8}",
    "selection.kind=curriculum",
    "selection.curriculum.min_groups=2",
    # the format reward (0.5) counts: level 0 is passed, so the level moves
    "selection.curriculum.success_threshold=0.2",
    "selection.curriculum.stall_groups=0",  # (taking in outcomes between publishes: inexact)
    "selection.budgets.enabled=true",
    "selection.budgets.max_samples=6",
    "rollout.max_new_tokens=12",
)
STEPS = 8  # half the resume tests' run: the kill still lands after step 4


def test_eta0_kill_and_resume_with_the_curriculum_is_exact(tmp_path: Path) -> None:
    _full_and_killed(tmp_path, CURRICULUM, "curriculum", STEPS)
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = _check_books(tmp_path / "killed", STEPS, 4, eta=0)
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    keys = [k for k in full if k.startswith(("curriculum/", "budgets/", "stream/"))]
    assert {k: summary[k] for k in keys} == {k: full[k] for k in keys}
    assert full["curriculum/arithmetic/moves"] >= 1 and full["budgets/items"] > 0
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    levels = [r["curriculum/arithmetic/level"] for r in rows if "curriculum/arithmetic/level" in r]
    assert len(levels) == STEPS and levels[-1] == 1.0

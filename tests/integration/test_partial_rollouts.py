"""Colocated placement: partial rollouts carry unfinished sequences across a weight
update (their tokens keep their versions and count toward staleness); without
partial rollouts every admitted item finishes before the trainer trains."""

from __future__ import annotations

import json

import pytest

from streamrl.run.launch import train
from streamrl.sources import build_task_source
from tests.tiny_run import TinyConfig

ETA = 2


def _run(tiny_config: TinyConfig, partial: bool, backend: str = "local"):
    cfg = tiny_config(
        "data.kind=longtail",
        "data.options={digits: 1, operators: '+', heldout_size: 8, long_fraction: 0.25, "
        "short_tokens: 3, long_tokens: 24}",
        "rollout.ignore_eos=true",
        "rollout.group_size=2",
        "train.items_per_step=4",
        "train.steps=8",
        "algorithm.dynamic_sampling=false",
        f"stream.max_staleness={ETA}",
        "runtime.placement=colocated",
        f"runtime.backend={backend}",
        f"rollout.partial_rollouts={str(partial).lower()}",
    )
    result = train(cfg)
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return result.summary, [r for r in rows if "staleness/max" in r]


def test_longtail_source_budgets() -> None:
    src = build_task_source(
        "longtail", digits=1, long_fraction=0.25, short_tokens=3, long_tokens=24
    )
    items = src.train_iter(0)
    budgets = [next(items).metadata["max_new_tokens"] for _ in range(400)]
    assert set(budgets) == {3, 24}
    assert 0.15 < budgets.count(24) / len(budgets) < 0.35


def test_partial_rollouts_carry_tokens_across_versions(tiny_config) -> None:
    summary, rows = _run(tiny_config, partial=True)
    assert summary["carried_tokens"] > 0
    assert sum(r["rollout/multi_version_samples"] for r in rows) > 0
    # carried tokens count toward staleness: some batch is older than one version,
    # and none beyond the bound
    assert all(r["staleness/max"] <= ETA for r in rows)
    assert max(r["staleness/max"] for r in rows) >= 1
    assert summary["stream/consumed"] == 8 * 4


def test_without_partial_rollouts_nothing_is_carried(tiny_config) -> None:
    summary, rows = _run(tiny_config, partial=False)
    assert summary["carried_tokens"] == 0
    assert all(r["rollout/multi_version_samples"] == 0 for r in rows)
    assert all(r["staleness/max"] <= ETA for r in rows)


@pytest.mark.slow
def test_partial_rollouts_on_the_process_backend(tiny_config) -> None:
    summary, rows = _run(tiny_config, partial=True, backend="process")
    assert summary["carried_tokens"] > 0
    assert all(r["staleness/max"] <= ETA for r in rows)

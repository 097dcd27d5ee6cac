"""Reward-hacking monitors: each fires on a synthetic run that hacks on purpose (its rows
built by hand), stays quiet on a normal one, writes its statistic to the row, warns in
one line on the console and in run.log, and with action=stop ends the run."""

from __future__ import annotations

import logging

import pytest

from streamrl.config import load_config
from streamrl.run.hooks import Decision
from streamrl.run.hooks.monitors import Monitors, final_status, is_judge
from tests.unit.run.fakes import FakePool

WEIGHTS = {"numeric_match": 1.0, "format_reward": 0.2, "llm_judge": 0.5}


def _normal(step: int) -> dict[str, float]:
    """A healthy run: length, entropy, KL and the components steady; accuracy rises."""
    row = {
        "response_length": 20.0 + step % 2,
        "entropy": 2.0 - 0.01 * step,
        "kl_ref": 0.01 * step,
        "reward_mean": 0.3 + 0.01 * step,
        "reward/numeric_match": 0.3 + 0.01 * step,
        "reward/format_reward": 0.9,
        "reward/llm_judge": 0.4,
        "reward_disagreement/llm_judge": 0.1,
    }
    if step % 4 == 0:
        row["eval/accuracy"] = 0.3 + 0.01 * step
    return row


def _hacks(name: str):
    """Rows of a run that hacks in the way ``name`` watches for."""

    def rows(step: int) -> dict[str, float]:
        row = _normal(step)
        late = step > 6
        if name == "length_drift":  # a reward that pays for length: it creeps up
            row["response_length"] = 20.0 * 1.2**step
        elif name == "length_jump":
            row["response_length"] = 60.0 if step == 7 else 20.0  # one sudden jump
        elif name == "component_dominance":
            row["reward/format_reward"] = 20.0 if late else 0.9  # weight 0.2: 4 of ~4.6
        elif name == "entropy_collapse":
            row["entropy"] = 2.0 if not late else 0.05
        elif name == "kl_acceleration":
            row["kl_ref"] = 0.01 * step + (0.05 * (step - 6) ** 2 if late else 0.0)
        elif name == "reward_divergence":
            row["reward_mean"] = 0.3 + (0.3 if late else 0.0)
            if "eval/accuracy" in row:
                row["eval/accuracy"] = 0.5 - (0.3 if late else 0.0)
        elif name == "judge_saturation":
            row["reward/llm_judge"] = 1.0 if late else 0.4
        elif name == "judge_disagreement":
            row["reward_disagreement/llm_judge"] = 0.8 if late else 0.1
        return row

    return rows


def _run(rows, *overrides: str, steps: int = 12):
    cfg = load_config(None, ["monitors.window=2", *overrides])
    said: list[str] = []
    logger = logging.getLogger("test-monitors")
    summary: dict = {}
    pool = FakePool()
    hook = Monitors(cfg.monitors, WEIGHTS, "numeric_match", pool, summary, logger, said.append)
    out = []
    for step in range(1, steps + 1):
        row = rows(step)
        decision = hook.after_step(step, row)
        out.append(row)
        if decision is Decision.STOP:
            break
    return out, said, summary, pool


NAMES = [
    "length_drift",
    "length_jump",
    "component_dominance",
    "entropy_collapse",
    "kl_acceleration",
    "reward_divergence",
    "judge_saturation",
    "judge_disagreement",
]


def test_every_monitor_is_quiet_on_a_normal_run() -> None:
    rows, said, summary, _ = _run(_normal)
    assert said == [] and summary == {}
    for name in NAMES:  # each had something to read, and wrote its statistic
        assert any(f"monitor/{name}" in r for r in rows), name
        assert not any(r.get(f"monitor_fired/{name}") for r in rows), name


@pytest.mark.parametrize("name", NAMES)
def test_each_monitor_fires_on_a_run_that_hacks(name: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="test-monitors"):
        rows, said, summary, _ = _run(_hacks(name))
    fired = [r for r in rows if r.get(f"monitor_fired/{name}")]
    assert fired, f"{name} never fired: {[r.get(f'monitor/{name}') for r in rows]}"
    others = {n for r in rows for n in NAMES if r.get(f"monitor_fired/{n}")}
    assert others == {name}, f"other monitors fired too: {others}"
    assert said and all(s.startswith(f"streamrl: warning: monitor {name} fired") for s in said)
    assert "\n" not in said[0]
    assert [r.message for r in caplog.records] == [
        s.removeprefix("streamrl: warning: ") for s in said
    ]
    assert summary == {}  # action: warn


def test_stop_ends_the_run_after_the_step_that_fired() -> None:
    rows, said, summary, pool = _run(_hacks("length_jump"), "monitors.length_jump.action=stop")
    assert len(rows) == 7 and rows[-1]["monitor_fired/length_jump"] == 1.0  # step 7 jumped
    assert summary == {"stopped_by_monitor": "length_jump", "stopped_early_at_step": 7}
    assert pool.calls[-1] == ("admit", False)
    assert "stopping the run" in said[0]
    assert final_status(summary) == "stopped_by_monitor" and final_status({}) == "completed"


def test_a_disabled_monitor_or_threshold_from_config() -> None:
    rows, said, _, _ = _run(_hacks("length_jump"), "monitors.length_jump.enabled=false")
    assert said == [] and not any("monitor/length_jump" in r for r in rows)
    rows, said, _, _ = _run(_hacks("length_jump"), "monitors.length_jump.threshold=5")
    assert said == [] and rows[6]["monitor/length_jump"] == pytest.approx(60 / 20 - 1)


def test_judges_by_name() -> None:
    assert all(map(is_judge, ["llm_judge", "llm_judge#2", "rubric_judge", "reward_model"]))
    assert not any(map(is_judge, ["numeric_match", "majority_vote"]))

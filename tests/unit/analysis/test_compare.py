"""`streamrl compare` on synthetic run directories where the right answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamrl.analysis.compare import CompareError, compare, group_runs, run_compare
from streamrl.analysis.runs import load_run
from streamrl.analysis.stats import adastop_decision, interval_estimates, probability_of_improvement
from streamrl.cli.main import main

REPS = 50  # bootstrap replications: enough to exercise the code, fast on 2 CPUs
STEPS = 20


def write_run(
    root: Path,
    name: str,
    seed: int,
    final: float,
    advantage: str = "grpo",
    extra_config: dict | None = None,
    restart_at: int | None = None,
) -> Path:
    """A run dir whose accuracy rises linearly to ``final``; eval logged every 5 steps."""
    path = root / name
    path.mkdir(parents=True)
    config = {
        "seed": seed,
        "run": {"name": name, "output_dir": str(root / f"out{seed}")},
        "model": {"name": "tiny-gpt"},
        "algorithm": {"name": advantage, "clip_eps": 0.2},
        **(extra_config or {}),
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for step in range(STEPS):
        if restart_at is not None and step == 2:  # a first attempt logged 2..restart_at, crashed
            lines += [json.dumps({"step": s, "accuracy": -1.0}) for s in range(2, restart_at + 1)]
        acc = final * (step + 1) / STEPS
        record = {"step": step, "wall_time": 0.5 * step, "reward_mean": acc, "accuracy": acc}
        if step % 5 == 4:
            record["eval/accuracy"] = acc
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"eval_accuracy_before": 0.0, "eval_accuracy_after": final, "steps": STEPS}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def write_group(root: Path, advantage: str, finals: np.ndarray) -> list[Path]:
    return [
        write_run(root, f"{advantage}-s{seed}", seed, float(v), advantage)
        for seed, v in enumerate(finals)
    ]


# --------------------------------------------------------------------------- statistics


def test_same_distribution_is_not_called_different(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    write_group(tmp_path, "grpo", rng.normal(0.5, 0.05, 6))
    write_group(tmp_path, "rloo", rng.normal(0.5, 0.05, 6))
    result = compare([tmp_path], "eval_accuracy_after", reps=REPS)

    assert len(result.groups) == 2 and len(result.pairs) == 1
    pair = result.pairs[0]
    assert pair.verdict in ("equal", "continue")
    assert 0.1 < pair.p_improvement[0] < 0.9
    (a_lo, a_hi), (b_lo, b_hi) = (result.intervals[g]["mean"][1:] for g in result.groups)
    assert a_lo <= b_hi and b_lo <= a_hi  # the CIs overlap


def test_same_distribution_with_all_stages_is_equal() -> None:
    rng = np.random.default_rng(3)
    scores = {"a": rng.normal(0.5, 0.05, 10), "b": rng.normal(0.5, 0.05, 10)}
    result = adastop_decision(scores, n_per_stage=5, n_stages=2)
    assert result.decisions[("a", "b")] == "equal"  # AdaStop accepts at the last stage
    assert result.finished and result.more_seeds_per_group == 0


def test_clear_shift_is_detected(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    write_group(tmp_path, "grpo", rng.normal(0.3, 0.02, 5))
    write_group(tmp_path, "rloo", rng.normal(0.8, 0.02, 5))
    out = tmp_path / "report"
    result = compare([tmp_path], "eval/accuracy", out_dir=out, reps=REPS)

    grpo, rloo = "algorithm.name=grpo", "algorithm.name=rloo"
    assert list(result.groups) == [grpo, rloo]
    pair = result.pairs[0]
    assert (pair.a, pair.b) == (grpo, rloo)
    assert pair.verdict == "smaller"  # grpo < rloo
    assert pair.verdict_text == f"{grpo} < {rloo}"
    assert pair.p_improvement[0] == pytest.approx(0.0)  # P(grpo > rloo)
    assert probability_of_improvement(result.scores[rloo], result.scores[grpo]) == 1.0
    for key in ("mean", "iqm"):
        assert result.intervals[grpo][key][2] < result.intervals[rloo][key][1]  # disjoint CIs
    assert result.adastop is not None and result.adastop.finished

    # Figures and the Markdown report are written.
    for name in ("learning_curves.png", "intervals.png", "comparison.md"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "comparison.md").read_text()
    assert "| group | seeds | mean [95% CI] | IQM [95% CI] |" in md
    assert f"{grpo} < {rloo}" in md


def test_adastop_two_sided_level() -> None:
    # 3 vs 3 fully separated runs: the exact two-sided permutation p-value is 2/C(6,3) = 0.1.
    scores = {"a": np.array([0.0, 1.0, 2.0]), "b": np.array([10.0, 11.0, 12.0])}
    assert adastop_decision(scores, 3, 1, alpha=0.05).decisions[("a", "b")] == "equal"
    assert adastop_decision(scores, 3, 1, alpha=0.11).decisions[("a", "b")] == "smaller"


def test_interval_estimates_contain_the_truth() -> None:
    rng = np.random.default_rng(1)
    est = interval_estimates({"x": rng.normal(1.0, 0.1, (20, 1))}, reps=200)
    for key in ("mean", "iqm"):
        point, lo, hi = est["x"][key]
        assert lo <= point <= hi and lo < 1.0 < hi


def test_adastop_asks_for_more_seeds() -> None:
    rng = np.random.default_rng(2)
    scores = {"a": rng.normal(0.5, 0.05, 3), "b": rng.normal(0.5, 0.05, 7)}
    result = adastop_decision(scores, n_per_stage=5, n_stages=3)
    assert result.decisions[("a", "b")] == "continue" and result.stages_done == 0
    assert result.more_seeds == {"a": 2, "b": 0}


# --------------------------------------------------------------------------- runs and groups


def test_grouping_ignores_seed_name_and_output_dir(tmp_path: Path) -> None:
    paths = [write_run(tmp_path, f"run{i}", seed=i, final=0.5) for i in (10, 2, 1)]
    paths.append(write_run(tmp_path, "other", seed=0, final=0.5, advantage="rloo"))
    groups = group_runs([load_run(p) for p in paths])
    assert {g: len(r) for g, r in groups.items()} == {
        "algorithm.name=grpo": 3,
        "algorithm.name=rloo": 1,
    }
    assert [r.seed for r in groups["algorithm.name=grpo"]] == [1, 2, 10]  # AdaStop's order


def test_labels_name_every_differing_key(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path, f"a{i}", i, 0.5, "grpo", {"train": {"lr": 1e-5}}) for i in range(2)
    ]
    paths += [write_run(tmp_path, f"b{i}", i, 0.5, "rloo", {"train": {"lr": 2e-5}}) for i in (0, 1)]
    groups = group_runs([load_run(p) for p in paths])
    assert list(groups) == [
        "algorithm.name=grpo, train.lr=1e-05",
        "algorithm.name=rloo, train.lr=2e-05",
    ]


def test_metrics_series_last_step_wins_and_prefix(tmp_path: Path) -> None:
    for seed in range(2):
        write_run(tmp_path / "runs", f"r{seed}", seed, 0.6 + 0.1 * seed, restart_at=7)
    run = load_run(tmp_path / "runs" / "r0")
    steps, values = run.series("accuracy")
    assert list(steps) == list(range(STEPS))  # repeated steps collapsed
    assert values[3] == pytest.approx(0.6 * 4 / STEPS)  # the crashed attempt's -1.0 is gone
    result = compare([tmp_path / "runs"], "metrics.jsonl:eval/accuracy", reps=REPS)
    (group,) = result.groups
    assert result.scores[group] == pytest.approx([0.6, 0.7])  # last logged value
    assert list(result.curves[group].steps) == [4, 9, 14, 19]
    assert any("only one group" in n for n in result.notes)
    # A summary scalar eval_X_after is drawn as the eval/X series.
    result = compare([tmp_path / "runs"], "eval_accuracy_after", reps=REPS)
    assert list(result.curves[group].steps) == [4, 9, 14, 19]
    assert result.pairs == [] and result.adastop is None


# --------------------------------------------------------------------------- errors


def test_missing_and_empty_and_non_run_directories(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="nope: no such directory"):
        compare([tmp_path / "nope"], "eval_accuracy_after")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="empty directory"):
        compare([tmp_path / "empty"], "eval_accuracy_after")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(CompareError, match="junk: not a run directory"):
        compare([tmp_path / "junk"], "eval_accuracy_after")
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(CompareError, match=r"half: not a run directory \(missing metrics.jsonl"):
        compare([half], "eval_accuracy_after")


def test_malformed_metrics_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_run(tmp_path, "r0", 0, 0.5)
    with open(path / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(CompareError, match=rf"metrics.jsonl:{STEPS + 1}: invalid JSON"):
        load_run(path)


def test_missing_metric_names_run_and_suggests(tmp_path: Path) -> None:
    for seed in range(2):
        write_run(tmp_path, f"r{seed}", seed, 0.5)
    with pytest.raises(CompareError, match=r"r0: metric 'eval_acc' not found.*did you mean"):
        compare([tmp_path], "eval_acc")
    with pytest.raises(CompareError, match="'eval_accuracy_after' not found in metrics.jsonl"):
        compare([tmp_path], "metrics.jsonl:eval_accuracy_after")


def test_single_seed_group_is_an_error(tmp_path: Path) -> None:
    write_group(tmp_path, "grpo", np.array([0.5, 0.6]))
    write_group(tmp_path, "rloo", np.array([0.5]))
    with pytest.raises(CompareError, match="algorithm.name=rloo' has 1 run.*at least 2 seeds"):
        compare([tmp_path], "eval_accuracy_after", reps=REPS)


def test_run_compare_exit_codes_and_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(5)
    runs = write_group(tmp_path / "runs", "grpo", rng.normal(0.3, 0.02, 2))
    runs += write_group(tmp_path / "runs", "rloo", rng.normal(0.8, 0.02, 2))
    out = tmp_path / "out"
    code = run_compare([str(p) for p in runs], "accuracy", str(out), fmt="markdown", reps=REPS)
    assert code == 0
    printed = capsys.readouterr().out
    assert "undecided: run 3 more seeds per group" in printed  # 2 of 5 seeds for stage 1
    assert "run more seeds: 3 more per group" in printed
    assert (out / "comparison.md").read_text() == printed

    assert run_compare([str(p) for p in runs], "accuracy", None, reps=REPS) == 0  # Rich table
    assert "P(A > B)" in capsys.readouterr().out

    assert run_compare([str(tmp_path / "missing")], "accuracy", None) == 1
    assert "missing: no such directory" in capsys.readouterr().err


# --------------------------------------------------------------------------- failed, unfinished


def write_ended(root: Path, name: str, summary: dict | None, metrics: str = "") -> Path:
    """A run that ended early: its config, some metrics text, and ``summary`` (if any)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": 9, "run": {"name": name}}))
    (path / "metrics.jsonl").write_text(metrics)
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_failed_interrupted_and_unfinished_runs_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = tmp_path / "runs"
    write_group(root, "grpo", np.array([0.3, 0.32]))
    write_group(root, "rloo", np.array([0.8, 0.82]))
    done = write_run(root, "grpo-s2", 2, 0.31)
    summary = json.loads((done / "summary.json").read_text())
    (done / "summary.json").write_text(json.dumps({**summary, "status": "completed"}))
    failed = write_ended(root, "failed", {"status": "failed", "error": "ValueError: bad lr\n  x"})
    (failed / "metrics.jsonl").unlink()  # failed before its first step
    killed = write_ended(root, "killed", {"status": "interrupted"}, '{"step": 0}\n{"ste')
    running = write_ended(root, "running", None, '{"step": 0, "eval/accuracy": 0.1}\n')

    result = compare([root], "eval_accuracy_after", reps=REPS)
    assert {g: len(r) for g, r in result.groups.items()} == {
        "algorithm.name=grpo": 3,
        "algorithm.name=rloo": 2,
    }
    assert result.skipped == {
        failed: "failed (ValueError: bad lr x)",
        killed: "interrupted",
        running: "unfinished (no summary.json: still running, or killed)",
    }
    assert f"skipped {failed}: failed (ValueError: bad lr x)" in result.notes
    assert f"skipped {killed}: interrupted" in result.notes

    # The run directories can also be named one by one; the notes go into the report.
    dirs = [str(p) for p in sorted(root.iterdir())]
    assert run_compare(dirs, "eval_accuracy_after", None, fmt="markdown", reps=REPS) == 0
    printed = capsys.readouterr().out
    assert f"- skipped {running}: unfinished (no summary.json" in printed
    assert "| algorithm.name=grpo | 3 |" in printed


def test_no_completed_run_left_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    failed = write_ended(tmp_path, "a", {"status": "failed", "error": "RuntimeError: boom"})
    running = write_ended(tmp_path, "b", None)
    with pytest.raises(CompareError, match="no completed run to compare"):
        compare([tmp_path], "eval_accuracy_after")
    assert run_compare([str(tmp_path)], "eval_accuracy_after", None) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no completed run to compare")
    assert f"skipped {failed}: failed (RuntimeError: boom)" in err
    assert f"skipped {running}: unfinished" in err


def test_error_after_skipping_lists_the_skipped_runs(tmp_path: Path) -> None:
    write_group(tmp_path, "grpo", np.array([0.3, 0.32]))
    failed = write_run(tmp_path, "grpo-s9", 9, 0.5, advantage="rloo")
    (failed / "summary.json").write_text(json.dumps({"status": "failed", "error": "OOM"}))
    write_run(tmp_path, "rloo-s0", 0, 0.8, advantage="rloo")
    with pytest.raises(CompareError, match=rf"(?s)has 1 run.*skipped {failed}: failed \(OOM\)"):
        compare([tmp_path], "eval_accuracy_after", reps=REPS)


@pytest.mark.parametrize(
    ("summary", "status"),
    [
        ({"status": "failed", "error": "RuntimeError: boom"}, "; run status: failed (RuntimeError"),
        (None, "; run status: unfinished (no summary.json"),
        ({"eval_accuracy_after": 0.5}, ""),
    ],
)
def test_plot_without_metrics_rows_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, summary: dict | None, status: str
) -> None:
    run = write_ended(tmp_path, "r", summary, metrics="\n")
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run}: nothing to plot: metrics.jsonl has no rows{status}")
    assert err.count("\n") == 1 and (status or "run status" not in err)  # one line
    assert not (run / "curves.png").exists()

    (run / "metrics.jsonl").unlink()
    assert main(["plot", str(run)]) == 2
    assert f"error: {run}: nothing to plot: no metrics.jsonl{status}" in capsys.readouterr().err


def test_plot_of_a_failed_run_with_rows_draws_it(tmp_path: Path, capsys) -> None:
    metrics = json.dumps({"step": 0, "reward_mean": 0.5, "staleness/mean": 0.0}) + "\n"
    run = write_ended(tmp_path, "r", {"status": "failed", "error": "boom"}, metrics)
    assert main(["plot", str(run), "--out", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

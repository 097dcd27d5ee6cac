"""`streamrl compare --fit sigmoid`: the ScaleRL curve is recovered where it is known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamrl.analysis.fit import fit_groups, fit_sigmoid, run_points, sigmoid
from streamrl.analysis.runs import RunError, load_run
from streamrl.cli.main import main

TRUE = {"A": 0.8, "C_mid": 120.0, "B": 1.5, "R0": 0.1}


def write_run(root: Path, name: str, seed: int, lr: float, noise: float = 0.01) -> Path:
    """Eval every 10 steps of a run whose accuracy follows TRUE (plus noise), 400 steps."""
    rng = np.random.default_rng(seed)
    path = root / name
    path.mkdir(parents=True)
    config = {"seed": seed, "run": {"name": name}, "train": {"lr": lr}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for step in range(401):
        row = {"step": step, "wall_time": 30.0 + 2.0 * step, "rollout/samples": 64}
        if step % 10 == 0:
            acc = float(sigmoid(np.array([step]), **_args(TRUE))[0] + rng.normal(0, noise))
            row["eval/accuracy"] = acc
        rows.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (path / "summary.json").write_text(json.dumps({"status": "completed"}))
    return path


def _args(p: dict[str, float]) -> dict[str, float]:
    return {"a": p["A"], "c_mid": p["C_mid"], "b": p["B"], "r0": p["R0"]}


def test_sigmoid_shape_by_hand() -> None:
    c = np.array([0.0, 120.0, 1e12])
    # R(0) = R0, R(C_mid) = (A + R0) / 2 = 0.45, R(inf) = A.
    np.testing.assert_allclose(sigmoid(c, **_args(TRUE)), [0.1, 0.45, 0.8], atol=1e-9)
    # B = 1.5 at C = 2 C_mid: 0.1 + 0.7 / (1 + 0.5**1.5) = 0.6594...
    assert sigmoid(np.array([240.0]), **_args(TRUE))[0] == pytest.approx(0.1 + 0.7 / 1.35355339)


def test_exact_points_recover_the_parameters() -> None:
    c = np.linspace(0, 600, 31)
    params, r0_fitted, rmse = fit_sigmoid(c, sigmoid(c, **_args(TRUE)), upper=1.0)
    assert not r0_fitted and rmse < 1e-6
    for k, v in TRUE.items():
        assert params[k] == pytest.approx(v, rel=1e-3), k


def test_without_a_point_at_zero_r0_is_fitted() -> None:
    c = np.linspace(20, 600, 30)
    params, r0_fitted, _ = fit_sigmoid(c, sigmoid(c, **_args(TRUE)))
    assert r0_fitted
    assert params["R0"] == pytest.approx(0.1, abs=0.01)
    assert params["A"] == pytest.approx(0.8, rel=0.01)


def test_too_few_points_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 or more distinct"):
        fit_sigmoid(np.array([0.0, 10.0, 10.0, 20.0]), np.array([0.1, 0.2, 0.2, 0.3]))


def test_noisy_seeds_give_intervals_that_cover_the_truth(tmp_path: Path) -> None:
    runs = [load_run(write_run(tmp_path, f"s{s}", s, 1e-4)) for s in range(4)]
    fits, notes = fit_groups({"g": runs}, "eval/accuracy", "step", reps=60)
    assert notes == []
    fit = fits["g"]
    assert fit.n_runs == 4 and fit.compute.size == 4 * 41
    for k in ("A", "C_mid", "B"):
        lo, hi = fit.intervals[k]
        assert lo <= TRUE[k] <= hi, (k, lo, hi)
        assert lo < fit.params[k] < hi
    assert fit.rmse == pytest.approx(0.01, rel=0.3)  # the noise level


def test_compute_axes(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, "s0", 0, 1e-4))
    c_step, y = run_points(run, "eval/accuracy", "step")
    c_wall, _ = run_points(run, "eval/accuracy", "wall_time")
    c_samples, _ = run_points(run, "eval/accuracy", "sum:rollout/samples")
    assert c_step[:3].tolist() == [0, 10, 20]
    assert c_wall[:3].tolist() == [0, 20, 40]  # counted from the first row (start-up excluded)
    assert c_samples[:3].tolist() == [0, 640, 1280]
    assert y.size == 41
    (tmp_path / "s0" / "metrics.jsonl").write_text(
        '{"step": 0, "n": 5}\n{"step": 1, "n": 3, "eval/accuracy": 0.1}\n'
    )
    with pytest.raises(RunError, match="use --compute sum:n"):  # a per-step count, not a total
        run_points(load_run(tmp_path / "s0"), "eval/accuracy", "n")


def test_cli_fits_each_recipe_and_writes_the_plot(tmp_path: Path, capsys) -> None:
    for s in range(3):
        write_run(tmp_path / "runs", f"a{s}", s, 1e-4)
        write_run(tmp_path / "runs", f"b{s}", s + 10, 3e-4)
    out = tmp_path / "out"
    argv = ["compare", str(tmp_path / "runs"), "--fit", "sigmoid", "--out", str(out)]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["fits"]) == {"train.lr=0.0001", "train.lr=0.0003"}
    assert doc["fits"]["train.lr=0.0001"]["params"]["A"] == pytest.approx(0.8, abs=0.03)
    assert (out / "sigmoid_fit.png").stat().st_size > 10_000
    assert "| A (asymptote)" in (out / "fit.md").read_text()


def test_cli_reports_an_unfittable_group(tmp_path: Path, capsys) -> None:
    path = write_run(tmp_path, "s0", 0, 1e-4)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k != "eval/accuracy" or r["step"] < 30} for r in rows]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["compare", str(path), "--fit", "sigmoid"]) == 1
    err = capsys.readouterr()
    assert "has 3 evaluation(s)" in err.out and "no group could be fitted" in err.err

"""Checkpoints and resume: atomic writes, bit-exact at eta = 0 across a SIGKILL of the
whole process tree, lossless at eta >= 1, graceful stop on SIGINT/SIGTERM."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.config import ConfigError, load_config, save_config
from streamrl.run.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from streamrl.run.launch import resume_config
from streamrl.stream.sample_stream import Group, SampleStream
from tests.paths import ROOT
from tests.tiny_run import tiny_args

ROOT = ROOT


def _ckpt(step: int) -> Checkpoint:
    return Checkpoint("rl", step, {"w": torch.full((3,), float(step))}, {}, {"step": step})


def test_checkpoints_are_atomic_kept_and_latest_moves_last(tmp_path: Path, monkeypatch) -> None:
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, _ckpt(step), keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["rl-000004", "rl-000006"]
    assert latest_checkpoint(tmp_path) == root / "rl-000006"
    assert load_checkpoint(root / "rl-000006").trainer["w"].tolist() == [6.0, 6.0, 6.0]

    real_save = torch.save

    def full_disk(obj, f):  # the disk fills up in the middle of the second file
        if "algorithm" in getattr(f, "name", ""):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="No space left.*rl-000006 is intact"):
        save_checkpoint(tmp_path, _ckpt(8), keep=2)
    assert latest_checkpoint(tmp_path) == root / "rl-000006"  # latest never moved
    assert not list(root.glob(".tmp-*")) and not (root / "rl-000008").exists()


def test_restored_stream_continues_the_books_and_never_over_admits() -> None:
    b, eta = 2, 1
    stream = SampleStream(b, eta)
    first = stream.admit(0, 4, timeout=0)  # capacity (0 + eta + 1) * b = 4
    for i in first[:2]:
        stream.put(Group(i, -1, []))
    stream.get_batch(timeout=0)
    stream.set_trainer_version(1)
    stream.reject(first[2], "filtered", "zero_reward_std")
    state, ledger = stream.checkpoint()
    assert ledger == [(0, "consumed", ""), (1, "consumed", ""), (2, "filtered", "zero_reward_std")]
    assert state["outstanding"] == [3] and state["issued"] == 4

    restored = SampleStream(b, eta)
    restored.restore(state)
    assert restored.stats.consumed == 2 and restored.stats.filtered["zero_reward_std"] == 1
    # version 1: (1 + eta + 1) * b - consumed - outstanding = 6 - 2 - 1 = 3, new indices go on
    assert restored.capacity(1) == 3
    assert restored.admit(1, 10, timeout=0) == [4, 5, 6]
    assert restored.admit(1, 10, timeout=0) == []
    restored.check_accounting()


def test_resume_refuses_keys_that_would_break_the_run(tmp_path: Path) -> None:
    save_config(load_config(None, ["train.steps=10"]), tmp_path / "config.yaml")
    assert resume_config(tmp_path, ["runtime.backend=process"]).runtime.backend == "process"
    with pytest.raises(ConfigError, match=r"train.lr cannot change on resume"):
        resume_config(tmp_path, ["train.lr=0.5"])
    with pytest.raises(ConfigError, match="not a run directory"):
        resume_config(tmp_path / "nope", [])


# ------------------------------------------------------------------ whole runs


def _args(out: Path, name: str, *extra: str) -> list[str]:
    """The run the resume tests kill; its final weights are saved (they are compared)."""
    return tiny_args(
        out,
        "sft.steps=4",
        "sft.examples_per_step=8",
        "data.options={digits: 1, operators: '+', heldout_size: 8}",
        "reward.components=[{name: numeric_match}, "
        "{name: format_reward, weight: 0.5, options: {pattern: '(?s).*[0-9].*'}}]",
        "rollout.group_size=4",
        "rollout.max_new_tokens=24",
        "rollout.ignore_eos=true",  # every step costs the same: the kill lands mid-run
        "train.items_per_step=4",
        "train.steps=16",
        "train.lr=0.01",
        "run.checkpoint_every=2",
        "run.save_weights=true",
        "runtime.threads=1",
        f"run.name={name}",
        *extra,
    )


def _streamrl(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: workers die with it
    )


def _latest_step(run_dir: Path) -> int:
    ckpt = latest_checkpoint(run_dir)
    return int(ckpt.name.split("-")[1]) if ckpt and ckpt.name.startswith("rl-") else -1


def _kill_mid_run(proc: subprocess.Popen, run_dir: Path, after_step: int, rng) -> int:
    """SIGKILL the whole process tree at a random moment after checkpoint ``after_step``."""
    deadline = time.monotonic() + 240
    while _latest_step(run_dir) < after_step:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.4))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert not (run_dir / "summary.json").exists(), "the run finished before the kill"
    return _latest_step(run_dir)


def _resume(run_dir: Path, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(run_dir), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr


def _check_books(run_dir: Path, steps: int, items_per_step: int, eta: int) -> dict:
    """Every issued item ended exactly once; every step logged once; staleness <= eta."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    ended = [i for r in rows for i in r["consumed"]]
    assert len(ended) == len(set(ended)) == steps * items_per_step == summary["stream/consumed"]
    for outcome in ("filtered", "failed"):
        ended += [i for r in rows for ids in r.get(outcome, {}).values() for i in ids]
    assert sorted(ended) == list(range(summary["stream/issued"])), "an item lost or duplicated"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(steps + 1))
    assert all(m["staleness/max"] <= eta for m in metrics if "staleness/max" in m)
    return summary


def _ledger_sets(path: Path) -> list[dict]:
    """The ledger's rows with each list of items as a set."""

    def sets(value):
        if isinstance(value, dict):
            return {k: sets(v) for k, v in value.items()}
        return frozenset(value) if isinstance(value, list) else value

    return [sets(json.loads(line)) for line in path.read_text().splitlines()]


def _full_and_killed(
    tmp_path: Path, args: tuple[str, ...], kill_seed: str, steps: int = 16
) -> Path:
    """Runs ``args`` whole (``full``), and again killed at a random moment after step 4
    and resumed (``killed``), each ``steps`` RL steps (not in ``args``); returns
    ``tmp_path``."""
    assert not [a for a in args if a.startswith("train.steps=")], "give steps instead"
    args = (*args, f"train.steps={steps}")
    full = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", *_args(tmp_path, "full", *args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert full.returncode == 0, full.stderr
    proc = _streamrl(*_args(tmp_path, "killed", *args))
    at = _kill_mid_run(proc, tmp_path / "killed", 4, random.Random(kill_seed))
    assert 4 <= at < steps
    _resume(tmp_path / "killed")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("backend, selection", [("process", "none"), ("local", "posterior")])
def test_eta0_kill_and_resume_leaves_bit_identical_weights(
    tmp_path: Path, backend: str, selection: str
) -> None:
    # each backend once (a local run without selection is a subset of the posterior case)
    # selection=posterior: prompt selection skips items, and its posterior is checkpointed;
    # the process backend's runs are the suite's slowest (workers start in each), so 10
    # steps: the kill still lands between checkpoints 4 and 10
    args = ("stream.max_staleness=0", f"runtime.backend={backend}", f"selection.kind={selection}")
    steps = 10 if backend == "process" else 16
    _full_and_killed(tmp_path, args, backend, steps)
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = _check_books(tmp_path / "killed", steps, 4, eta=0)
    full_summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["stream/issued"] == full_summary["stream/issued"]
    # dynamic sampling (on by default) dropped groups and refilled them, in both runs alike
    assert (
        summary["stream/filtered/zero_reward_std"]
        == full_summary["stream/filtered/zero_reward_std"]
        > 0
    )
    if selection != "none":
        assert summary["selection/skipped"] == full_summary["selection/skipped"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    # reference carries everything successes does (the buffer, its rates, the carried
    # share) and the dropped groups besides; the suite runs it, `pytest -m soak` both
    "source",
    [pytest.param("successes", marks=pytest.mark.soak), "reference"],
)
def test_eta0_kill_and_resume_with_hints_and_interleaved_sft_leaves_bit_identical_weights(
    tmp_path: Path, source: str
) -> None:
    """The hint schedule (pending outcomes, revisit queue, hint lengths) and the
    demonstration buffer (its prompts, rates, remainder and random generator; with
    source=reference the dropped groups not yet handed to the algorithm, in the pool's
    checkpoint) survive a SIGKILL: the resumed run hints, revisits and mixes in what the
    uninterrupted run did."""
    args = (
        "stream.max_staleness=0",
        "selection.kind=hints",
        "algorithm.interleaved_sft.share=0.25",
        f"algorithm.interleaved_sft.source={source}",
    )
    _full_and_killed(tmp_path, args, "hints")
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = _check_books(tmp_path / "killed", 16, 4, eta=0)
    full_summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    for key in ("stream/issued", "hints/hinted", "hints/revisits", "hints/shortened"):
        assert summary[key] == full_summary[key], key
    assert summary["hints/hinted"] > 0
    rows = [
        [json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("full", "killed")
    ]
    demos = [[r.get("sft/demo_units") for r in runs] for runs in rows]
    assert demos[0] == demos[1] and any(demos[0][1:])


@pytest.mark.slow
@pytest.mark.parametrize("acceptance", ["skip", "importance"])
def test_eta0_kill_and_resume_with_the_likelihood_gate_decides_the_same(
    tmp_path: Path, acceptance: str
) -> None:
    """The gate's candidate bundles, spares and budget survive a SIGKILL: the resumed run
    scores, skips, hands back and consumes exactly what the uninterrupted run did, and
    so do importance acceptance's random draws (seeded by item and version). A chosen
    candidate's samples reach the engine a few event-loop turns after its scoring step,
    so which step first batches them depends on timing; the engine is batch-invariant,
    so the weights are the same, bit for bit."""
    args = (
        "stream.max_staleness=0",
        "selection.kind=likelihood",
        "rollout.ignore_eos=false",  # the gate scores answer + EOS
        *("sft.steps=150", "sft.examples_per_step=16", "sft.lr=0.003"),
        # a weak policy: p_hat of 0.18 is enough; importance: about 1 in 3 generated
        f"selection.threshold={0.001 if acceptance == 'skip' else 1e-4}",
        f"selection.acceptance={acceptance}",
        # this weak policy answers most groups all wrong: dynamic sampling would drop ~40
        # groups per consumed one. Its exactness across a kill is the test above's
        "algorithm.dynamic_sampling=false",
    )
    _full_and_killed(tmp_path, args, "likelihood")
    summary = _check_books(tmp_path / "killed", 16, 4, eta=0)
    full_summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    # every step ended the same items the same way (within a step, in the order their
    # groups happened to finish)
    ledgers = [_ledger_sets(tmp_path / n / "ledger.jsonl") for n in ("full", "killed")]
    assert ledgers[0] == ledgers[1]
    for key in ("selection/scored", "selection/skipped", "selection/spares"):
        assert summary[key] == full_summary[key] > 0, key
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_eta1_two_kills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    args = _args(tmp_path, "run", "stream.max_staleness=1", "algorithm.dynamic_sampling=true")
    rng = random.Random(1)
    proc = _streamrl(*args)
    first = _kill_mid_run(proc, tmp_path / "run", 2, rng)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(tmp_path / "run")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    second = _kill_mid_run(proc, tmp_path / "run", first + 2, rng)
    assert second > first
    _resume(tmp_path / "run")
    summary = _check_books(tmp_path / "run", 16, 4, eta=1)
    assert summary["resumed_items"] > 0  # unconsumed items were issued again


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_gracefully_and_the_run_resumes(tmp_path: Path, sig) -> None:
    proc = _streamrl(*_args(tmp_path, "run", "train.steps=12"))
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 240
    while (
        not (run_dir / "metrics.jsonl").exists()
        or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 3
    ):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "--resume" in err and "Traceback" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    stopped_at = _latest_step(run_dir)
    assert stopped_at >= 2
    _resume(run_dir)
    _check_books(run_dir, 12, 4, eta=1)


@pytest.mark.slow
def test_a_second_signal_aborts_at_once(tmp_path: Path) -> None:
    proc = _streamrl(*_args(tmp_path, "run", "train.steps=2000"))
    run_dir = tmp_path / "run"
    while not (run_dir / "metrics.jsonl").exists():
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    # Two signals that land while the main thread is inside one C call coalesce into
    # one: send the second only once the first has been acknowledged.
    for line in proc.stderr:
        if "received: stopping" in line:
            break
    else:
        pytest.fail("the first SIGINT was never acknowledged")
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    assert proc.returncode == -signal.SIGINT


def test_a_checkpoint_that_cannot_be_written_stops_cleanly(tmp_path: Path, monkeypatch, capsys):
    """A full disk at a checkpoint: a one-line error naming the intact checkpoint, the
    run marked failed, and the previous checkpoint still the latest."""
    import streamrl.run.checkpointing
    from streamrl.cli.main import main

    real = streamrl.run.checkpointing.save_checkpoint

    def fill_up(run_dir, ckpt, keep):
        if ckpt.stage == "rl" and ckpt.step >= 4:
            raise CheckpointError(
                f"checkpoint {ckpt.name} could not be written (No space left on device); "
                "the last good checkpoint rl-000002 is intact"
            )
        return real(run_dir, ckpt, keep)

    monkeypatch.setattr(streamrl.run.checkpointing, "save_checkpoint", fill_up)
    args = _args(tmp_path, "full", "rollout.max_new_tokens=3", "rollout.ignore_eos=false")
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "error: checkpoint rl-000004 could not be written" in err and "Traceback" not in err
    run_dir = tmp_path / "full"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert latest_checkpoint(run_dir).name == "rl-000002"


@pytest.mark.slow
def test_a_kill_inside_sft_resumes_from_the_sft_checkpoint_bit_exactly(tmp_path: Path) -> None:
    args = ("sft.steps=60", "train.steps=4", "stream.max_staleness=0")
    full = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", *_args(tmp_path, "full", *args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert full.returncode == 0, full.stderr
    proc = _streamrl(*_args(tmp_path, "killed", *args))
    run_dir = tmp_path / "killed"
    deadline = time.monotonic() + 240
    while (latest_checkpoint(run_dir) or Path("none")).name < "sft-000004":
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    at = latest_checkpoint(run_dir).name
    assert at.startswith("sft-") and at != "sft-000060", at  # killed inside SFT
    _resume(run_dir)
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(run_dir / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    sft_rows = (run_dir / "sft_metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in sft_rows] == list(range(60))


# ------------------------------------------------------------------ run directories


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and time of change (but run.lock's, which names its holder)."""
    return {
        str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != "run.lock"
    }


def _no_temporaries(run_dir: Path) -> None:
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name], list(run_dir.rglob("*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One completed run (SFT, then 6 RL steps at eta = 0, a checkpoint every 2)."""
    from streamrl.cli.main import main

    out = tmp_path_factory.mktemp("finished")
    args = ("sft.steps=2", "train.steps=6", "rollout.max_new_tokens=8", "run.keep_checkpoints=9")
    assert main(["train", *_args(out, "run", "stream.max_staleness=0", *args)]) == 0
    return out / "run"


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def test_a_completed_run_is_left_as_it_is_and_its_final_state_is_checkpointed(
    finished: Path, tmp_path: Path, capsys
) -> None:
    from streamrl.cli.main import main

    names = sorted(p.name for p in (finished / "checkpoints").iterdir())
    assert names == ["done-000006", "latest", "rl-000000", "rl-000002", "rl-000004", "sft-000002"]
    final = load_checkpoint(finished / "checkpoints" / "done-000006")
    weights = load_file(str(finished / "model" / "model.safetensors"))
    assert all(torch.equal(final.trainer["model"][k], w) for k, w in weights.items())
    assert final.trainer["optimizer"]["state"] and final.state["summary"]["stream/consumed"] == 24
    run_dir = _copy(finished, tmp_path / "run")
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert "is complete (summary.json: completed); nothing to resume" in capsys.readouterr().out
    assert _snapshot(run_dir) == before


def test_a_run_killed_after_its_final_checkpoint_only_writes_its_summary(
    finished: Path, tmp_path: Path, capsys
) -> None:
    from streamrl.cli.main import main

    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()
    kept = {k: v for k, v in _snapshot(run_dir).items() if not k.startswith(("run.", "ledger"))}
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert "had ended (checkpoint done-000006): summary.json written" in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    original = json.loads((finished / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["eval_accuracy_after"] == original["eval_accuracy_after"]
    now = _snapshot(run_dir)
    assert all(now[k][0] == v[0] for k, v in kept.items())  # nothing trained or re-logged
    assert (run_dir / "ledger.jsonl").read_text() == (finished / "ledger.jsonl").read_text()


def test_no_latest_and_a_damaged_newest_checkpoint_resume_from_the_one_before_bit_exactly(
    finished: Path, tmp_path: Path, capsys
) -> None:
    """As a run killed after step 4: `latest` gone, rl-000004's weights random bytes. The
    resume says so, continues from rl-000002 (SFT is not run again) and ends with the
    uninterrupted run's weights, every step logged once and every item ended once."""
    from streamrl.cli.main import main

    run_dir = _copy(finished, tmp_path / "run")
    for gone in ("summary.json", "checkpoints/latest"):
        (run_dir / gone).unlink()
    for gone in ("model", "checkpoints/done-000006"):
        shutil.rmtree(run_dir / gone)
    damaged = run_dir / "checkpoints" / "rl-000004" / "trainer.pt"
    damaged.write_bytes(random.Random(0).randbytes(damaged.stat().st_size))
    sft_rows = (run_dir / "sft_metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "checkpoints/latest is missing" in err and "Traceback" not in err
    assert f"skipping rl-000004: checkpoint file {damaged} is unreadable" in err
    assert "resuming from checkpoint" in (run_dir / "run.log").read_text()
    a = load_file(str(finished / "model" / "model.safetensors"))
    b = load_file(str(run_dir / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (run_dir / "sft_metrics.jsonl").read_text() == sft_rows
    _check_books(run_dir, 6, 4, eta=0)
    _no_temporaries(run_dir)


def test_two_processes_on_one_run_directory_the_second_is_refused(
    finished: Path, tmp_path: Path, capsys
) -> None:
    from streamrl.cli.main import main

    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "done-000006")  # killed after step 4
    first = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (run_dir / "run.lock").read_text().strip() != str(first.pid):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"is in use by another streamrl process (pid {first.pid})" in line, line
    assert first.wait(240) == 0, first.stderr.read()
    _check_books(run_dir, 6, 4, eta=0)


def test_the_model_directory_cannot_be_written_one_line_and_the_checkpoints_stay(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from streamrl.cli.main import main
    from streamrl.engines.train.engine import TrainEngine

    def half_then_full(self, path, tokenizer=None):
        (Path(path) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TrainEngine, "save", half_then_full)
    args = ("sft.steps=0", "train.steps=2", "rollout.max_new_tokens=4")
    assert main(["train", *_args(tmp_path, "run", *args)]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("[")]
    assert line == f"error: cannot write {tmp_path / 'run' / 'model'}: No space left on device"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    assert not (tmp_path / "run" / "model").exists()
    assert latest_checkpoint(tmp_path / "run").name == "rl-000000"  # no "done"
    _no_temporaries(tmp_path / "run")


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_during_a_checkpoint_one_line_nothing_left_and_the_run_resumes(
    small_disk: Path, capsys
) -> None:
    """A real full disk: a checkpoint (two fit, three do not) fails with one line; its
    temporary files are gone, the last good checkpoint is intact, summary.json says
    failed and why; with room again, the run resumes from that checkpoint and completes."""
    from streamrl.cli.main import main

    args = ("sft.steps=0", "train.steps=8", "run.keep_checkpoints=1", "rollout.max_new_tokens=8")
    assert main(["train", *_args(small_disk, "run", *args)]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if not x.startswith("[")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.match(
        r"error: checkpoint rl-0000\d\d could not be written to .* \(No space left on device\); "
        r"the last good checkpoint (rl-0000\d\d) is intact",
        lines[0],
    ), lines[0]
    run_dir = small_disk / "run"
    intact = re.search(r"the last good checkpoint (\S+) is intact", lines[0])[1]
    assert latest_checkpoint(run_dir).name == intact
    load_checkpoint(run_dir / "checkpoints" / intact)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    _no_temporaries(run_dir)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert "resuming from checkpoint" in (run_dir / "run.log").read_text()


def test_a_damaged_metrics_row_stops_the_resume_with_one_line_and_changes_nothing(
    finished: Path, tmp_path: Path, capsys
) -> None:
    from streamrl.cli.main import main

    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "done-000006")
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows[2] = json.dumps({k: v for k, v in json.loads(rows[2]).items() if k != "step"})
    (run_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]  # and a note on `latest`
    assert line == f"error: {run_dir / 'metrics.jsonl'}:3: no 'step' field" and "Trace" not in err
    assert {k: v for k, v in _snapshot(run_dir).items() if k != "run.log"} == {
        k: v for k, v in before.items() if k != "run.log"
    }

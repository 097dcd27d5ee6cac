"""A run directory's files read back and written safely: every damaged file is one line
naming it (and its line), a resume falls back past damaged checkpoints, `latest` is only
a hint, every write is atomic, one process writes a run at a time, and commands that
replace outputs check everything first. (Whole runs through the CLI: test_resume.py.)"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamrl.cli.main import main
from streamrl.config import Config
from streamrl.core.atomic import WriteError, distinct_paths, replacing, write_text
from streamrl.run.checkpoint import (
    Checkpoint,
    CheckpointError,
    find_checkpoint,
    latest_checkpoint,
    save_checkpoint,
)
from streamrl.run.files import STEP_ROW, UnreadableFile, read_json, read_jsonl
from streamrl.run.lock import RunDirectoryInUse, run_lock
from streamrl.run.tracking import read_summary, truncate_jsonl
from tests.paths import ROOT

ROOT = ROOT


def _ckpt(step: int, stage: str = "rl") -> Checkpoint:
    """A checkpoint holding everything a resume reads (small stand-ins)."""
    trainer = {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}}
    trainer.update(scheduler=None, global_step=step)
    state = {"rng": {}, "summary": {"wall_time_s": 1.0 * step}, "pool": {}, "recorder": {}}
    return Checkpoint(stage, step, trainer, {}, state)


def _two_checkpoints(run_dir: Path) -> Path:
    for step in (2, 4):
        save_checkpoint(run_dir, _ckpt(step), keep=5)
    return run_dir / "checkpoints"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _pickle_without(path: Path, key: str) -> None:
    obj = torch.load(path, weights_only=False)
    del obj[key]
    torch.save(obj, path)
    meta = path.parent / "meta.json"  # a consistent size: only the missing key is wrong
    data = json.loads(meta.read_text())
    data["files"][path.name] = path.stat().st_size
    meta.write_text(json.dumps(data))


def _meta_without(path: Path, key: str) -> None:
    data = json.loads(path.read_text())
    del data[key]
    path.write_text(json.dumps(data))


DAMAGE = {
    "random bytes": lambda p: p.write_bytes(random.Random(0).randbytes(p.stat().st_size)),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncate,
    "missing": lambda p: p.unlink(),
}
#: (file, damage, what the one line must say)
CORPUS = [
    *[(f, d, d.split()[0] if d != "random bytes" else "") for f in ("trainer.pt",) for d in DAMAGE],
    *[(f, d, "") for f in ("state.pt", "algorithm.pt") for d in ("random bytes", "truncated")],
    ("meta.json", "random bytes", "not UTF-8|not valid JSON"),
    ("meta.json", "empty", "empty"),
    ("meta.json", "truncated", "not valid JSON"),
    ("meta.json", "no stage", "no 'stage' field"),
    ("meta.json", "no step", "no 'step' field"),
    ("meta.json", "step a string", "'step' is '4', expected an integer"),
    ("state.pt", "no pool", "has no 'pool'"),
    ("state.pt", "no summary", "has no 'summary'"),
    ("trainer.pt", "no optimizer", "has no 'optimizer'"),
]


def _damage(path: Path, how: str) -> None:
    if how in DAMAGE:
        DAMAGE[how](path)
    elif how == "step a string":
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "step": "4"}))
    elif path.name == "meta.json":
        _meta_without(path, how.split()[1])
    else:
        _pickle_without(path, how.split()[1])


@pytest.mark.parametrize("name, how, says", CORPUS, ids=[f"{f}-{d}" for f, d, _ in CORPUS])
def test_a_damaged_checkpoint_is_one_line_and_the_previous_one_is_used(
    tmp_path: Path, name: str, how: str, says: str
) -> None:
    root = _two_checkpoints(tmp_path)
    _damage(root / "rl-000004" / name, how)
    ckpt, notes = find_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "rl-000002"
    assert ckpt.trainer["model"]["w"].tolist() == [2.0, 2.0, 2.0]
    (line,) = notes
    assert "\n" not in line and str(root / "rl-000004") in line and name.split(".")[0] in line
    assert re.search(says, line), line
    # both damaged: an error, never a silent start over
    _damage(root / "rl-000002" / name, how)
    with pytest.raises(CheckpointError, match="no checkpoint in .* is readable .*refusing"):
        find_checkpoint(tmp_path)


def test_latest_is_a_hint_missing_dangling_or_behind(tmp_path: Path) -> None:
    root = _two_checkpoints(tmp_path)
    hints = [
        (None, "is missing"),
        ("rl-000009", "does not exist"),
        ("rl-000002", "is not the newest"),
        ("\x00\xff", "does not exist"),
    ]
    for hint, said in hints:
        if hint is None:
            (root / "latest").unlink()
        else:
            (root / "latest").write_text(hint)
        ckpt, notes = find_checkpoint(tmp_path)
        assert ckpt.name == "rl-000004" and len(notes) == 1 and said in notes[0], notes
    # a killed writer's temporary directory is not a checkpoint
    (root / ".tmp-rl-000006-123").mkdir()
    assert latest_checkpoint(tmp_path).name == "rl-000004"
    assert find_checkpoint(tmp_path / "nothing") == (None, [])


def test_a_checkpoint_of_the_same_step_replaces_a_stale_one_whole(tmp_path: Path) -> None:
    root = _two_checkpoints(tmp_path)
    (root / "rl-000004" / "trainer.pt").write_bytes(b"stale")
    save_checkpoint(tmp_path, _ckpt(4), keep=5)
    assert find_checkpoint(tmp_path)[0].trainer["global_step"] == 4
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rl-000002", "rl-000004"]


def test_a_checkpoint_write_that_fails_anywhere_leaves_no_trace(tmp_path, monkeypatch) -> None:
    """A full disk as the OS reports it (OSError), as torch's zip writer reports it (a
    RuntimeError), and in `latest`: one line, no temporary files, the last good one kept."""
    root = _two_checkpoints(tmp_path)
    before = sorted(p.name for p in root.iterdir())
    real = torch.save
    for error in (OSError(errno.ENOSPC, "No space left on device"), RuntimeError("file write")):

        def fail(obj, f, error=error):
            real(obj, f)
            raise error

        monkeypatch.setattr(torch, "save", fail)
        with pytest.raises(CheckpointError, match="rl-000006 could not .*rl-000004 is intact"):
            save_checkpoint(tmp_path, _ckpt(6), keep=5)
        assert sorted(p.name for p in root.iterdir()) == before
    monkeypatch.setattr(torch, "save", real)

    def no_rename(self, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "replace", no_rename)
    with pytest.raises(CheckpointError, match="rl-000006 is written, but .*latest could not"):
        save_checkpoint(tmp_path, _ckpt(6), keep=5)
    assert not list(root.glob(".*tmp*")) and (root / "latest").read_text() == "rl-000004"
    assert find_checkpoint(tmp_path)[0].name == "rl-000006"  # the hint lags; found anyway


# ------------------------------------------------------------------ JSON and JSONL


JSONL_CORPUS = [
    (b'{"step": 0}\n{"loss": 1.0}\n{"step": 2}\n', ":2: no 'step' field"),
    (b'{"step": 0}\nnot json\n{"step": 2}\n', ":2: not valid JSON"),
    (b'{"step": 0}\n[1, 2]\n', ":2: expected a JSON object"),
    (b'{"step": "3"}\n', ":1: 'step' is '3', expected an integer"),
    (b'{"step": true}\n', ":1: 'step' is True, expected an integer"),
    (b'{"step": 0}\n\xff\xfe\x00garbage\n', ":2: not UTF-8"),
]


@pytest.mark.parametrize("data, says", JSONL_CORPUS)
def test_a_damaged_step_log_row_is_one_line_naming_file_and_line(
    tmp_path: Path, data: bytes, says: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(data)
    with pytest.raises(UnreadableFile) as e:
        truncate_jsonl(path, 10)
    assert str(e.value).startswith(str(path) + says.split(":")[0] + ":" + says.split(":")[1])
    assert says.split(": ", 1)[1] in str(e.value) and "\n" not in str(e.value)
    assert path.read_bytes() == data  # nothing changed


def test_a_torn_last_line_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(path, STEP_ROW) == [{"step": 1}, {"step": 2}]
    assert truncate_jsonl(path, 1) == 1 and path.read_text() == '{"step": 1}\n'


SUMMARY_CORPUS = [
    (random.Random(0).randbytes(64) + b"\xff", "not UTF-8|not valid JSON"),
    (b"", "empty"),
    (b'{"status": "compl', "not valid JSON"),
    (b'{"wall_time_s": 3}', "no 'status' field"),
    (b'"completed"', "expected a JSON object"),
]


@pytest.mark.parametrize("data, says", SUMMARY_CORPUS)
def test_a_damaged_summary_is_one_line_and_not_taken_as_completed(tmp_path, data, says):
    (tmp_path / "summary.json").write_bytes(data)
    summary, problem = read_summary(tmp_path)
    assert summary is None and str(tmp_path / "summary.json") in problem
    assert re.search(says, problem) and "\n" not in problem
    with pytest.raises(UnreadableFile, match="summary.json"):
        read_json(tmp_path / "summary.json", {"status": str})


CONFIG_CORPUS = [
    (b"\x89PNG\r\n\x1a\n\xff\x00", "not UTF-8"),
    (b"", "empty or not a mapping"),
    (
        b"model:\n  name_or_path: tiny-small\n",
        f"at the top level ({len(Config.model_fields) - 1} of {len(Config.model_fields)} missing)",
    ),
    (b"model:\n  name_or_path: [tiny\n", "config.yaml:3: invalid YAML"),
]


@pytest.mark.parametrize("data, says", CONFIG_CORPUS)
def test_resume_of_a_damaged_config_is_one_line(tmp_path: Path, capsys, data, says) -> None:
    (tmp_path / "config.yaml").write_bytes(data)
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert line.startswith("error: ") and says in line and "config.yaml" in line, line


# ------------------------------------------------------------------ atomic writes


def test_a_failed_replacement_leaves_the_old_file_or_directory(tmp_path: Path) -> None:
    old = tmp_path / "model"
    old.mkdir()
    (old / "weights").write_text("old")
    full = pytest.raises(WriteError, match=r"cannot write .*model: No space left on device")
    with full, replacing(old, directory=True) as tmp:
        (tmp / "weights").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (old / "weights").read_text() == "old" and os.listdir(tmp_path) == ["model"]
    with replacing(old, directory=True) as tmp:
        (tmp / "weights").write_text("new")
    assert os.listdir(old) == ["weights"] and (old / "weights").read_text() == "new"
    assert os.listdir(tmp_path) == ["model"]
    write_text(tmp_path / "a.txt", "x")
    failing = pytest.raises(WriteError, match="a.txt: ValueError: the writer failed")
    with failing, replacing(tmp_path / "a.txt") as tmp:
        tmp.write_text("y")
        raise ValueError("the writer failed")
    assert (tmp_path / "a.txt").read_text() == "x" and len(os.listdir(tmp_path)) == 2


def test_an_output_equal_to_an_input_or_another_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("precious\n")
    (tmp_path / "link.jsonl").symlink_to(out)
    for outputs in (
        {"--out": out, "--preferences": out},
        {"--out": out, "--preferences": tmp_path / "." / "out.jsonl"},
        {"--out": out, "--preferences": tmp_path / "link.jsonl"},
    ):
        with pytest.raises(ValueError, match="--preferences .* is the same file as --out"):
            distinct_paths({}, outputs)
    with pytest.raises(ValueError, match="--out .* is the same file as --config"):
        distinct_paths({"--config": out}, {"--out": out})
    distinct_paths({"--config": out}, {"--out": tmp_path / "a", "--preferences": None})
    assert out.read_text() == "precious\n"


def test_log_completions_refuses_one_file_for_both_outputs_before_loading(tmp_path, capsys):
    out = tmp_path / "logged.jsonl"
    out.write_text('{"kept": true}\n')
    argv = ["data", "log-completions", str(tmp_path / "no-model"), "--out", str(out)]
    assert main([*argv, "--preferences", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "is the same file as --out" in line and out.read_text() == '{"kept": true}\n'


def test_log_completions_writes_both_outputs_or_neither(tmp_path, monkeypatch) -> None:
    from streamrl.run import log_completions

    out, prefs = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    out.write_text("old a\n")
    prefs.write_text("old b\n")
    real = Path.write_text

    def full_disk(self, text):
        if "b.jsonl" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(WriteError, match="b.jsonl: No space left"):
        log_completions.write_outputs({out: [{"r": 1}], prefs: [{"p": 2}]})
    monkeypatch.undo()
    assert out.read_text() == "old a\n" and prefs.read_text() == "old b\n"
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl"]
    log_completions.write_outputs({out: [{"r": 1}], prefs: [{"p": 2}]})
    assert out.read_text() == '{"r": 1}\n' and prefs.read_text() == '{"p": 2}\n'


# ------------------------------------------------------------------ make-minari


@pytest.fixture
def minari_root(tmp_path, monkeypatch) -> Path:
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


MAKE = ["data", "make-minari", "CartPole-v1", "--episodes", "2", "--dataset-id", "cp/a-v0"]


@pytest.mark.parametrize(
    "typo, says",
    [
        (["--policy", "runs/nope"], "--policy runs/nope: neither 'random' nor"),
        (["--policy", "random", "--dataset-id", "cp/a"], "--dataset-id 'cp/a': expected"),
        (["--policy", "random", "--episodes", "0"], "expected an integer >= 1 (got '0')"),
        (["--policy", "random", "--env-options", "[1]"], "--env-options must be a JSON object"),
    ],
)
def test_make_minari_overwrite_with_a_typo_keeps_the_old_dataset(minari_root, capsys, typo, says):
    assert main([*MAKE, "--policy", "random"]) == 0
    before = {p: p.read_bytes() for p in minari_root.rglob("*") if p.is_file()}
    capsys.readouterr()
    try:
        code = main([*MAKE, *typo, "--overwrite"])
    except SystemExit as e:  # argparse's own checks: usage, then the error line
        code = e.code
    assert code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert says in line, line
    assert {p: p.read_bytes() for p in minari_root.rglob("*") if p.is_file()} == before


def test_make_minari_overwrite_that_fails_mid_write_keeps_the_old_dataset(
    minari_root, capsys, monkeypatch
):
    import minari

    from streamrl.sources import minari_make

    assert main([*MAKE, "--policy", "random"]) == 0
    before = {p: p.read_bytes() for p in minari_root.rglob("*") if p.is_file()}
    real = minari_make._create

    def full_disk(*args, **kwargs):
        real(*args, **kwargs)  # written in full to the staging directory, then the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(minari_make, "_create", full_disk)
    assert main([*MAKE, "--policy", "random", "--episodes", "5", "--overwrite"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in minari_root.rglob("*") if p.is_file()} == before
    monkeypatch.setattr(minari_make, "_create", real)
    assert main([*MAKE, "--policy", "random", "--episodes", "5", "--overwrite"]) == 0
    assert minari.load_dataset("cp/a-v0").total_episodes == 5
    assert not [p for p in minari_root.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ the run lock


HOLD = """
import sys, time
from streamrl.run.lock import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_one_process_at_a_time_and_a_killed_holder_frees_the_directory(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = pytest.raises(RunDirectoryInUse, match=f"in use by .*pid {holder.pid}")
        with refused, run_lock(tmp_path):
            pass
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock
        holder.wait()
    with run_lock(tmp_path), run_lock(tmp_path):  # re-entrant within a process
        assert (tmp_path / "run.lock").read_text().strip() == str(os.getpid())
    again = subprocess.run(  # and free for another process once left
        [sys.executable, "-c", HOLD.replace("time.sleep(60)", "pass"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert again.stdout.strip() == "held", again.stderr


def test_a_pickle_that_is_not_a_checkpoint_part_is_refused(tmp_path: Path) -> None:
    root = _two_checkpoints(tmp_path)
    path = root / "rl-000004" / "algorithm.pt"
    torch.save([1, 2, 3], path)
    _meta = json.loads((root / "rl-000004" / "meta.json").read_text())
    _meta["files"]["algorithm.pt"] = path.stat().st_size
    (root / "rl-000004" / "meta.json").write_text(json.dumps(_meta))
    ckpt, notes = find_checkpoint(tmp_path)
    assert ckpt.name == "rl-000002" and "holds a list" in notes[0]


def test_eval_refuses_an_output_that_is_its_prompt_file(tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    argv = ["eval", str(tmp_path / "model"), "--split", str(prompts), "--out", str(prompts)]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--out" in line and "is the same file as --split" in line
    assert prompts.read_text() == '{"prompt": "1+1=", "answer": "2"}\n'

"""Checkpoints: everything needed to continue a run as if nothing had happened.

    RUN_DIR/checkpoints/
        rl-000050/        a complete checkpoint (RL step 50; sft-000500 during SFT,
                          dpo-000020 / alol-000020 during the DPO / A-LoL stages;
                          done-000200: the final state of a run that completed)
            trainer.pt    policy weights (adapters included), optimizer, LR schedule
            trainer.dcp/  a sharded trainer's weights and optimizer, every rank's shards
                          (torch.distributed.checkpoint; trainer.pt then holds the
                          schedule and marks ``model`` and ``optimizer`` as "dcp")
            algorithm.pt  the algorithm's extra models (frozen reference, critic)
            state.pt      RNG states; for RL the stream's books and version, every issued
                          but unconsumed item, the task source's position, the pool's
                          counters, the step metrics' totals; the summary so far
            meta.json     stage, step, time and each file's size: written last, it marks
                          the checkpoint complete
        latest            the name of the newest complete checkpoint (a hint)

Writing is atomic. The files go into a temporary directory and are flushed to disk
(fsync), the directory is renamed into place and the parent flushed, and only then
is ``latest`` replaced (written to a temporary file, flushed, renamed). A crash at
any moment leaves every checkpoint directory complete. A write that fails (a full disk,
or any error of the writer) removes its temporary directory and raises
:class:`CheckpointError`; the previous checkpoint stays intact.

Reading trusts no file. :func:`find_checkpoint` lists the checkpoint directories newest
first (``latest`` is only a hint: missing, dangling or behind, it is corrected with a
note) and returns the first that loads and holds what a resume needs; each one that does
not is skipped with one line naming its file and why. Checkpoints that exist but none
readable is an error, never a silent start over.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.core.atomic import TMP_PREFIX, fsync_dir, reason, swap_directories
from streamrl.engines.train.dcp import DCP_DIR, DCP_FORMAT
from streamrl.run.files import UnreadableFile, read_json

LATEST = "latest"
#: the stages of a run in the order they run (checkpoint names start with them); "done"
#: is the final state of a completed run
STAGE_ORDER = ("sft", "dpo", "alol", "rl", "done")
NAME = re.compile(r"^(" + "|".join(STAGE_ORDER) + r")-(\d{6})$")
PARTS = ("trainer", "algorithm", "state")
#: what a resume reads from each part, by stage ("*": every stage)
NEEDED = {
    "trainer": {"*": ("model", "optimizer", "scheduler", "global_step")},
    "state": {"*": ("rng", "summary"), "rl": ("pool", "recorder")},
}


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


@dataclass
class Checkpoint:
    stage: str  # one of STAGE_ORDER
    step: int  # steps of the stage completed
    trainer: dict[str, Any]
    algorithm: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: a sharded trainer's writer of its weights and optimizer (every rank's shards)
    #: into a directory: called with ``<checkpoint>/trainer.dcp`` before ``meta.json``
    write_sharded: Callable[[Path], None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.step:06d}"


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _Writes:
    """A file whose write errors are kept: torch's zip writer reports a failed write (a
    full disk) only as an "unexpected pos" RuntimeError; this gives back the OS's error."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()

    def __getattr__(self, name: str) -> Any:  # name, fileno, ...: the file's
        return getattr(self.f, name)


def _write(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        out = _Writes(f)
        try:
            write(out)
        except Exception:
            if out.error is not None:
                raise out.error from None
            raise
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: Path, ckpt: Checkpoint, keep: int) -> Path:
    """Write ``ckpt`` atomically, point ``latest`` at it, keep the ``keep`` newest."""
    root = run_dir / "checkpoints"
    final = root / ckpt.name
    tmp = root / f"{TMP_PREFIX}{ckpt.name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        sizes = {}
        for part, obj in zip(PARTS, (ckpt.trainer, ckpt.algorithm, ckpt.state), strict=True):
            _write(tmp / f"{part}.pt", lambda f, obj=obj: torch.save(obj, f))
            sizes[f"{part}.pt"] = (tmp / f"{part}.pt").stat().st_size
        if ckpt.write_sharded is not None:
            ckpt.write_sharded(tmp / DCP_DIR)
            fsync_dir(tmp / DCP_DIR)
        meta = {"stage": ckpt.stage, "step": ckpt.step, "time": time.time(), "files": sizes}
        _write(tmp / "meta.json", lambda f: f.write(json.dumps(meta).encode()))
        fsync_dir(tmp)
        if final.exists():  # a stale copy of this step (an earlier attempt): swap it out
            swap_directories(tmp, final)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(final)
        fsync_dir(root)
    except Exception as e:  # a full disk shows as OSError, or as torch's RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        previous = next((p.name for p in list_checkpoints(run_dir) if _complete(p)), None)
        raise CheckpointError(
            f"checkpoint {ckpt.name} could not be written to {root} ({reason(e)}); "
            + (f"the last good checkpoint {previous} is intact" if previous else "none exists")
        ) from e
    pointer = root / f".{LATEST}.tmp"
    try:
        _write(pointer, lambda f: f.write(ckpt.name.encode()))
        pointer.replace(root / LATEST)
        fsync_dir(root)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {ckpt.name} is written, but {root / LATEST} could not be updated "
            f"({reason(e)}); a resume finds {ckpt.name} without it"
        ) from e
    finally:
        pointer.unlink(missing_ok=True)
    _prune(root, keep, current=ckpt.name)
    ckpt.path = final
    return final


def _latest_name(root: Path) -> str | None:
    """What ``latest`` says (None if it is missing or unreadable)."""
    try:
        name = (root / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name or None


def _age(path: Path) -> tuple[int, int]:
    # stages in the order they run, then the step
    m = NAME.match(path.name)
    return (STAGE_ORDER.index(m[1]), int(m[2])) if m else (-1, -1)


def _complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The checkpoint directories of ``run_dir`` (named ``<stage>-<step>``), newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=_age, reverse=True)


def _prune(root: Path, keep: int, current: str) -> None:
    done = list_checkpoints(root.parent)[::-1]  # oldest first
    for old in done[: max(0, len(done) - keep)]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a writer that was killed
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint directory that has its completeness marker (``meta.json``),
    whatever ``latest`` says; None if there is none. (To load one for a resume, use
    :func:`find_checkpoint`, which also checks its contents.)"""
    return next((p for p in list_checkpoints(run_dir) if _complete(p)), None)


def _load_part(path: Path, expected_size: int | None) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint file {path} is empty")
    if expected_size is not None and size != expected_size:
        raise CheckpointError(
            f"checkpoint file {path} has {size} bytes, meta.json says {expected_size} (truncated?)"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # any damage: bad pickle, torn zip, unknown class, ...
        raise CheckpointError(f"checkpoint file {path} is unreadable ({reason(e)})") from None


def load_checkpoint(path: Path) -> Checkpoint:
    """Read the checkpoint in directory ``path``; any damaged file is a
    :class:`CheckpointError` naming it and why."""
    path = Path(path)
    try:
        meta = read_json(path / "meta.json", {"stage": str, "step": int})
    except UnreadableFile as e:
        raise CheckpointError(f"checkpoint file {e}") from None
    m = NAME.match(path.name)
    if meta["stage"] not in STAGE_ORDER or meta["step"] < 0:
        raise CheckpointError(
            f"checkpoint file {path / 'meta.json'}: stage {meta['stage']!r} step {meta['step']} "
            f"is not a checkpoint (stages: {', '.join(STAGE_ORDER)})"
        )
    if m is not None and (m[1], int(m[2])) != (meta["stage"], meta["step"]):
        raise CheckpointError(
            f"checkpoint file {path / 'meta.json'} says {meta['stage']}-{meta['step']:06d}, "
            f"not {path.name}"
        )
    sizes = meta.get("files") if isinstance(meta.get("files"), dict) else {}
    parts = {}
    for part in PARTS:
        parts[part] = _load_part(path / f"{part}.pt", sizes.get(f"{part}.pt"))
        if not isinstance(parts[part], dict):
            raise CheckpointError(
                f"checkpoint file {path / part}.pt holds a {type(parts[part]).__name__}, "
                "not a checkpoint part"
            )
    if parts["trainer"].get("format") == DCP_FORMAT:  # a sharded trainer's weights
        dcp_dir = path / DCP_DIR
        if not (dcp_dir / ".metadata").is_file():
            raise CheckpointError(f"checkpoint directory {dcp_dir} has no .metadata")
        parts["trainer"]["dcp_dir"] = str(dcp_dir)
    return Checkpoint(meta["stage"], meta["step"], path=path, **parts)


def check_resumable(ckpt: Checkpoint) -> None:
    """Everything a resume reads from ``ckpt`` is there (else CheckpointError naming the
    file and the missing entry)."""
    for part, needs in NEEDED.items():
        held = getattr(ckpt, part)
        keys = (*needs["*"], *needs.get(ckpt.stage, ()))
        missing = [k for k in keys if k not in held]
        if missing:
            raise CheckpointError(f"checkpoint file {ckpt.path}/{part}.pt has no {missing[0]!r}")
    summary = ckpt.state["summary"]
    if not isinstance(summary, dict) or not isinstance(summary.get("wall_time_s"), (int, float)):
        raise CheckpointError(f"checkpoint file {ckpt.path}/state.pt: its summary has no wall time")


def find_checkpoint(run_dir: str | Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint of ``run_dir`` that loads and holds what a resume needs, and
    notes (one line each) on what was skipped and why; (None, notes) if there is no
    checkpoint at all. Checkpoints that exist with none of them readable raise
    :class:`CheckpointError`: starting over would replace them."""
    root = Path(run_dir) / "checkpoints"
    candidates = list_checkpoints(run_dir)
    notes: list[str] = []
    hint = _latest_name(root)
    if candidates and hint != candidates[0].name:
        if hint is None:
            said = "is missing"
        elif (root / hint).is_dir():
            said = f"names {hint!r}, which is not the newest"
        else:
            said = f"names {hint!r}, which does not exist"
        notes.append(f"{root / LATEST} {said}: looking for the newest complete checkpoint")
    for path in candidates:
        try:
            ckpt = load_checkpoint(path)
            check_resumable(ckpt)
        except CheckpointError as e:
            notes.append(f"skipping {path.name}: {e}")
            continue
        return ckpt, notes
    if candidates:
        newest = notes[-len(candidates)].split(": ", 1)[1]
        raise CheckpointError(
            f"no checkpoint in {root} is readable ({len(candidates)} found; the newest: "
            f"{newest}); refusing to start the run over, which would replace them (move "
            f"{root} away to start over)"
        )
    return None, notes

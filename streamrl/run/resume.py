"""What ``--resume`` finds in a run directory, and what it does about it.

- ``summary.json`` says completed: the run is left as it is (nothing trained, nothing
  written).
- The newest readable checkpoint is the run's final one (``done-<step>``: killed after it
  and before ``summary.json``): the summary is written from it; nothing is trained again.
- Otherwise the run continues from its newest readable checkpoint
  (:func:`streamrl.run.checkpoint.find_checkpoint`: ``latest`` is a hint; each unreadable one
  is skipped with a line naming its file; checkpoints with none readable is an error).
- No checkpoint at all (killed before the first one): the run starts over in its
  directory, and says so on the console and in ``run.log``. Nothing is lost by this: a
  resume always drops what a killed process logged after its last checkpoint, and here
  there is none.

Every note goes to the console (stderr) at once and to ``run.log`` once it is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrl.algorithms.stages import PRE_RL_STAGES
from streamrl.config import Config
from streamrl.run.checkpoint import Checkpoint, find_checkpoint
from streamrl.run.hooks.monitors import final_status
from streamrl.run.tracking import RunDirectory, note, read_summary


@dataclass
class Found:
    """What a resume found in ``run_dir`` (a fresh run: nothing)."""

    run_dir: Path
    completed: dict[str, Any] | None = None  # summary.json of a completed run
    ckpt: Checkpoint | None = None  # the checkpoint to continue from
    notes: list[str] = field(default_factory=list)  # what was skipped or corrected, and why
    fresh: bool = True  # a new run (not a resume)

    @property
    def ended(self) -> bool:
        """The run wrote its final checkpoint (only ``summary.json`` is missing)."""
        return self.ckpt is not None and self.ckpt.stage == "done"


def completed_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` if it says the run completed (an unreadable one is noted)."""
    summary, problem = read_summary(run_dir)
    if problem is not None:
        note(None, f"{problem}: the run is not taken as completed")
    finished = ("completed", "stopped_by_monitor")  # (a monitor's stop ends a run too)
    return summary if summary is not None and summary["status"] in finished else None


def find_resume(run_dir: Path) -> Found:
    """What to do with ``run_dir`` (see the module docstring); notes are printed now."""
    found = Found(run_dir, completed=completed_summary(run_dir), fresh=False)
    if found.completed is not None:
        return found
    found.ckpt, found.notes = find_checkpoint(run_dir)
    for line in found.notes:
        note(None, line)
    return found


def keep_through(cfg: Config, ckpt: Checkpoint) -> dict[str, int]:
    """The metric rows a checkpoint covers (pre-RL stages log 0-based steps in their own
    files, RL rows 0..step): stages before the checkpoint's are complete, later ones empty."""
    if ckpt.stage in ("rl", "done"):
        return {"": ckpt.step, **{s: getattr(cfg, s).steps - 1 for s in PRE_RL_STAGES}}
    at = PRE_RL_STAGES.index(ckpt.stage)
    keep = {s: getattr(cfg, s).steps - 1 if k < at else -1 for k, s in enumerate(PRE_RL_STAGES)}
    return {"": -1, **keep, ckpt.stage: ckpt.step - 1}


def open_run(cfg: Config, found: Found) -> RunDirectory:
    """The run directory, new (a fresh run, or a resume with no checkpoint) or reopened
    at ``found.ckpt``; the notes go to its ``run.log``."""
    ckpt = found.ckpt
    if ckpt is None and not found.fresh:
        found.notes.append(
            f"no checkpoint in {found.run_dir / 'checkpoints'}: nothing to continue from, so "
            f"the run starts over in {found.run_dir} (what an earlier attempt logged is "
            "replaced)"
        )
        note(None, found.notes[-1])
    if ckpt is None:
        run = RunDirectory.create(cfg, found.run_dir)
    else:
        wall = ckpt.state["summary"]["wall_time_s"]
        run = RunDirectory.reopen(cfg, found.run_dir, keep_through(cfg, ckpt), wall)
    for line in found.notes:
        run.log.warning("%s", line)
    if ckpt is not None:
        run.log.info("resuming from checkpoint %s", ckpt.path)
    return run


def refinish(cfg: Config, found: Found) -> dict[str, Any]:
    """A run that wrote its final checkpoint but not ``summary.json``: write it from the
    checkpoint. Returns the summary."""
    assert found.ckpt is not None and found.ckpt.path is not None
    summary = dict(found.ckpt.state["summary"])
    run = open_run(cfg, found)
    run.finish(summary, status=final_status(summary))
    note(run, f"the run had ended (checkpoint {found.ckpt.path.name}): summary.json written")
    return summary

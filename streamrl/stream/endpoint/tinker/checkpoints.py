"""Checkpoints: ``save_state`` (adapter + AdamW state: training resumes exactly where it
stopped) and ``save_weights_for_sampler`` (adapter only), named by Tinker paths

    tinker://<model_id>/weights/<name>           save_state
    tinker://<model_id>/sampler_weights/<name>   save_weights_for_sampler

and stored as ``<state_dir>/checkpoints/<model_id, %-quoted>/<kind>/<name>/`` with
``adapter.safetensors``, ``optimizer.pt`` (save_state only) and ``meta.json`` (the base
model and the LoRA config, so a new server loads it without its run). Each directory is
written next to its place and renamed there (:mod:`streamrl.core.atomic`): a crash leaves
the old checkpoint or the new one, never a mix. A checkpoint outlives the server.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch
from safetensors.torch import load_file, save_file

from streamrl.config.options import check_path_component
from streamrl.core.atomic import replacing
from streamrl.stream.endpoint.tinker.adapters import LoraSpec, adapter_state
from streamrl.stream.endpoint.tinker.runs import Run

KINDS = ("weights", "sampler_weights")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read (the message says which and why)."""


@dataclass
class Checkpoint:
    path: str  # tinker://...
    dir: Path

    def exists(self) -> bool:
        return (self.dir / "meta.json").is_file()


def locate(state_dir: Path, path: str) -> Checkpoint:
    """The checkpoint a Tinker path names (CheckpointError for a malformed one)."""
    if not path.startswith("tinker://"):
        raise CheckpointError(f"path {path!r}: expected tinker://<model_id>/<kind>/<name>")
    parts = path[len("tinker://") :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS:
        raise CheckpointError(
            f"path {path!r}: expected tinker://<model_id>/(weights|sampler_weights)/<name>"
        )
    model_id, kind, name = parts
    try:
        check_path_component(name)
        run_dir = check_path_component(quote(model_id, safe=""))
    except ValueError as e:
        raise CheckpointError(f"path {path!r}: {e}") from None
    return Checkpoint(path, state_dir / "checkpoints" / run_dir / kind / name)


def checkpoint_for(state_dir: Path, model_id: str, kind: str, name: str) -> Checkpoint:
    return locate(state_dir, f"tinker://{model_id}/{kind}/{name}")


def save(ck: Checkpoint, run: Run, *, optimizer: bool, meta: dict[str, Any]) -> None:
    """Writes ``run``'s adapter (and AdamW state) to ``ck`` in one rename."""
    info = {
        "base_model": run.base.path,
        "lora": run.spec.to_json(),
        "model_id": run.model_id,
        "steps": run.steps,
        "time": time.time(),
        **meta,
    }
    with replacing(ck.dir, directory=True) as tmp:
        save_file(adapter_state(run.model), str(tmp / "adapter.safetensors"))
        if optimizer:
            torch.save(run.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "meta.json").write_text(json.dumps(info, indent=2) + "\n")


@dataclass
class Loaded:
    meta: dict[str, Any]
    spec: LoraSpec
    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None


def read(ck: Checkpoint, *, optimizer: bool) -> Loaded:
    """A checkpoint's adapter (and, asked for, its AdamW state)."""
    if not ck.exists():
        raise CheckpointError(f"{ck.path}: no such checkpoint")
    try:
        meta = json.loads((ck.dir / "meta.json").read_text())
        spec = LoraSpec(**meta["lora"])
        adapter = load_file(str(ck.dir / "adapter.safetensors"))
        state = None
        if optimizer:
            opt = ck.dir / "optimizer.pt"
            if not opt.is_file():
                raise CheckpointError(
                    f"{ck.path}: holds no optimizer state (save_state writes it; "
                    "save_weights_for_sampler does not)"
                )
            state = torch.load(opt, weights_only=True)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{ck.path}: unreadable checkpoint ({e})") from None
    return Loaded(meta, spec, adapter, state)

"""Sharded checkpoints of a train engine's weights and optimizer, through
``torch.distributed.checkpoint`` (DCP).

``save_sharded(engine, dir)`` is collective: each rank writes its own shards into
``dir`` (one directory every rank can reach). ``load_sharded(engine, dir)`` reads them
into whatever sharding the engine has now, so a checkpoint written by N ranks loads on
M ranks (DCP reshards), and into an unsharded engine without a process group.
``load_full`` puts an unsharded engine's ``checkpoint_state`` (full tensors, the
optimizer's state keyed by parameter order) into a sharded engine.

Conversions: DCP (N ranks) -> DCP engine (M ranks), DCP -> unsharded engine, unsharded
``trainer.pt`` -> sharded engine. The model and its trained extras (a value head) are
keyed ``model.<name>`` and ``extra<i>.<name>``; the optimizer's state by the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.utils._pytree import tree_map_only

#: marks the ``model`` and ``optimizer`` entries of a ``trainer.pt`` whose tensors are in DCP
DCP_FORMAT = "dcp"
#: the DCP directory's name inside a checkpoint directory
DCP_DIR = "trainer.dcp"


def trained_modules(engine: Any) -> torch.nn.Module:
    """The model and its trained extras under one root: the names DCP keys them by."""
    modules = {"model": engine.model}
    modules.update({f"extra{i}": m for i, m in enumerate(engine.extras)})
    return torch.nn.ModuleDict(modules)


def save_sharded(engine: Any, path: str | Path) -> None:
    """Every rank writes its shards of the weights and optimizer state into ``path``."""
    fresh = not engine.optimizer.state
    model_sd, optim_sd = get_state_dict(trained_modules(engine), engine.optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path))
    if fresh:  # get_state_dict made zero states (a step at lr 0): an unstepped optimizer
        engine.optimizer.state.clear()  # has none, and its first step must count as 1


def load_sharded(engine: Any, path: str | Path) -> None:
    """Read ``path`` (written by any number of ranks) into the engine's own sharding."""
    root = trained_modules(engine)
    model_sd, optim_sd = get_state_dict(root, engine.optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    # a parameter without optimizer state there (no gradient yet) is left without one
    dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
    set_state_dict(
        root,
        engine.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
    stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    _drop_unsaved(
        engine,
        root,
        {n for n, _ in root.named_parameters() if f"optimizer.state.{n}.step" in stored},
    )


def _drop_unsaved(engine: Any, root: torch.nn.Module, saved: set[str]) -> None:
    """Loading initialises every parameter's optimizer state (a step at lr 0); one that
    had none when saved (no gradient yet) gets none back, so its first step counts as 1."""
    for name, param in root.named_parameters():
        if name not in saved:
            engine.optimizer.state.pop(param, None)


def load_full(engine: Any, state: dict[str, Any]) -> None:
    """An unsharded ``checkpoint_state`` (``model``, ``extras``, the optimizer's
    id-keyed ``state_dict``) into a sharded engine: each rank keeps its shards."""
    root = trained_modules(engine)
    model_sd = {f"model.{k}": v for k, v in state["model"].items()}
    for i, extra in enumerate(state.get("extras", [])):
        model_sd.update({f"extra{i}.{k}": v for k, v in extra.items()})
    names = [n for n, p in root.named_parameters() if p.requires_grad]
    optim = state["optimizer"]
    optim_sd = {
        "state": {names[i]: s for i, s in optim["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]
        ],
    }
    set_state_dict(
        root,
        engine.optimizer,
        model_state_dict=model_sd,
        optim_state_dict=optim_sd,
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    _drop_unsaved(engine, root, set(optim_sd["state"]))


def full_state(engine: Any) -> dict[str, Any]:
    """The weights and optimizer state as full CPU tensors keyed by name (the DCP keys),
    on every rank (collective when sharded; also works unsharded, without a group)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(trained_modules(engine), engine.optimizer, options=options)
    # copies: on one rank the "full" tensors are the engine's own, which training changes
    return tree_map_only(torch.Tensor, torch.clone, {"model": model_sd, "optimizer": optim_sd})

"""What the environment task sources share: their items, and the optional libraries.

An environment item (``rollout.episode: env``) carries no prompt: its metadata names
the environment (``env``: the adapter's kind and options, plain data), the seed it
resets with (``env_seed``) and who plays each seat (``seats``: ``policy`` for the
trained policy, or a scripted opponent's name). Items of one group share the seed, so
the group's episodes start from the same state.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from streamrl.core.types import Item

EXTRA = "envs"  # pip install 'streamrl[envs]'


def require(module: str, kind: str) -> ModuleType:
    """Import an environment library, or a ValueError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ValueError(
            f"data.kind={kind} needs the {module.split('.')[0]} package ({e}): "
            f"pip install 'streamrl[{EXTRA}]'"
        ) from None


def env_item(
    item_id: str,
    env: dict[str, Any],
    seed: int,
    seats: list[str],
    *,
    domain: str | None = None,
    **metadata: Any,
) -> Item:
    """An environment item; ``domain`` tags an evaluation item (``eval/accuracy/<domain>``)."""
    meta: dict[str, Any] = {"env": env, "env_seed": int(seed), "seats": list(seats), **metadata}
    if domain is not None:
        meta["domain"] = domain
    return Item(id=item_id, metadata=meta)

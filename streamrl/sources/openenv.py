"""OpenEnv environments as a task source (``data.kind: openenv``, ``rollout.episode:
env``): an item is one episode of an in-process OpenEnv ``Environment``, reset with the
item's seed (:mod:`streamrl.rollout.envs.openenv`).

Options:
    load:               ``module:function`` returning an OpenEnv ``Environment``
    args:               its keyword arguments
    action:             ``module:Class``, the environment's ``Action`` type
    action_field:       the action's text field the policy's move goes into
    observation_field:  the observation's text field the policy sees
    heldout_size:       held-out episodes (seeds disjoint from training's)

``tests/unit/rollout/test_env_openenv.py`` builds one in place.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from typing import Any

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource
from streamrl.sources.environments import env_item, require

KIND = "openenv"
EVAL_SEED = 1_000_000  # held-out episodes' seeds start here


def import_object(path: str) -> Any:
    """``module:name`` imported."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r} is not module:name")
    return getattr(importlib.import_module(module), name)


def build_environment(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(a fresh OpenEnv environment, its action type) as ``spec`` names them."""
    core = require("openenv.core", KIND)
    env = import_object(spec["load"])(**spec.get("args", {}))
    if not isinstance(env, core.Environment):
        raise ValueError(f"{spec['load']!r} returned {type(env).__name__}, not an Environment")
    action = import_object(spec["action"])
    if spec["action_field"] not in action.model_fields:
        raise ValueError(f"{spec['action']} has no field {spec['action_field']!r}")
    return env, action


class OpenEnvTaskSource(TaskSource):
    def __init__(
        self,
        load: str,
        action: str,
        action_field: str,
        observation_field: str,
        args: dict[str, Any] | None = None,
        heldout_size: int = 100,
    ) -> None:
        if heldout_size < 1:
            raise ValueError("heldout_size must be >= 1")
        self.spec = {
            "kind": KIND,
            "id": load,
            "load": load,
            "args": dict(args or {}),
            "action": action,
            "action_field": action_field,
            "observation_field": observation_field,
        }
        try:
            build_environment(self.spec)  # the names are checked now, not per episode
        except (ImportError, AttributeError, TypeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
        self.heldout_size = heldout_size

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        k = 0
        while True:
            yield env_item(
                f"{self.spec['load']}:{k}", self.spec, rng.randrange(EVAL_SEED), ["policy"]
            )
            k += 1

    def heldout(self, n: int | None = None) -> list[Item]:
        count = self.heldout_size if n is None else n
        return [
            env_item(f"{self.spec['load']}:eval-{k}", self.spec, EVAL_SEED + k, ["policy"])
            for k in range(count)
        ]

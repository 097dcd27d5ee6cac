"""OpenEnv environments as a task source (``data.kind: openenv``, ``rollout.episode:
env``): an item is one episode of an OpenEnv environment, reset with the item's seed
(:mod:`streamrl.rollout.envs.openenv`). The environment runs in-process (``load``) or
behind an OpenEnv server (``url``: its ``create_app`` served by uvicorn), reached with
OpenEnv's own client, one session per episode.

Options:
    load:               ``module:function`` returning an OpenEnv ``Environment``
    url:                instead of ``load``: the server's address (``http://host:port``)
    args:               ``load``'s keyword arguments
    action:             ``module:Class``, the environment's ``Action`` type (optional
                        with ``url``: the move is then sent as ``{action_field: text}``)
    action_field:       the action's text field the policy's move goes into
    observation_field:  the observation's text field the policy sees
    heldout_size:       held-out episodes (seeds disjoint from training's)

``tests/unit/rollout/test_env_openenv.py`` builds one in place and one on a loopback port.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource
from streamrl.sources.environments import env_item, require

KIND = "openenv"
EVAL_SEED = 1_000_000  # held-out episodes' seeds start here
URL_SCHEMES = ("http", "https", "ws", "wss")


def import_object(path: str) -> Any:
    """``module:name`` imported."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r} is not module:name")
    return getattr(importlib.import_module(module), name)


def action_type(spec: dict[str, Any]) -> Any:
    """The action type ``spec["action"]`` names (None when it names none), its
    ``action_field`` checked."""
    if not spec.get("action"):
        return None
    action = import_object(spec["action"])
    if spec["action_field"] not in getattr(action, "model_fields", {}):
        raise ValueError(f"{spec['action']} has no field {spec['action_field']!r}")
    return action


def build_environment(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(a fresh in-process OpenEnv environment, its action type) as ``spec`` names them."""
    core = require("openenv.core", KIND)
    env = import_object(spec["load"])(**spec.get("args", {}))
    if not isinstance(env, core.Environment):
        raise ValueError(f"{spec['load']!r} returned {type(env).__name__}, not an Environment")
    return env, action_type(spec)


def check_spec(spec: dict[str, Any]) -> None:
    """The names and the address checked once, when the source is built (not per
    episode); a missing library is the error naming the extra."""
    if (spec["load"] is None) == (spec["url"] is None):
        raise ValueError("data.kind=openenv takes one of load (in-process) or url (a server)")
    if spec["url"] is None:
        if not spec["action"]:
            raise ValueError("data.kind=openenv with load needs action (module:Class)")
        build_environment(spec)
        return
    require("openenv.core", KIND)
    address = urlparse(spec["url"])
    if address.scheme not in URL_SCHEMES or not address.hostname:
        raise ValueError(f"url {spec['url']!r} is not {'|'.join(URL_SCHEMES)}://host[:port]")
    action_type(spec)


class OpenEnvTaskSource(TaskSource):
    def __init__(
        self,
        action_field: str,
        observation_field: str,
        load: str | None = None,
        url: str | None = None,
        action: str | None = None,
        args: dict[str, Any] | None = None,
        heldout_size: int = 100,
    ) -> None:
        if heldout_size < 1:
            raise ValueError("heldout_size must be >= 1")
        self.spec = {
            "kind": KIND,
            "id": load or url,
            "load": load,
            "url": url,
            "args": dict(args or {}),
            "action": action,
            "action_field": action_field,
            "observation_field": observation_field,
        }
        try:
            check_spec(self.spec)
        except (ImportError, AttributeError, TypeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
        self.heldout_size = heldout_size

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        k = 0
        while True:
            yield env_item(
                f"{self.spec['id']}:{k}", self.spec, rng.randrange(EVAL_SEED), ["policy"]
            )
            k += 1

    def heldout(self, n: int | None = None) -> list[Item]:
        count = self.heldout_size if n is None else n
        return [
            env_item(f"{self.spec['id']}:eval-{k}", self.spec, EVAL_SEED + k, ["policy"])
            for k in range(count)
        ]

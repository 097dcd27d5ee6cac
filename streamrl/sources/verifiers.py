"""verifiers environments as a task source (``data.kind: verifiers``, ``rollout.episode:
env``): an item is one row of the environment's dataset, rolled out by the environment's
own code with streamrl's policy as its model, scored by its rubric
(:mod:`streamrl.rollout.envs.verifiers`).

Options:
    load:          a verifiers environment id (``vf.load_environment``) or
                   ``module:function`` that returns a ``vf.Environment``
    args:          the loader's keyword arguments
    demonstration: a scripted player whose moves are the supervised warm-start's
                   demonstrations (``sft.steps > 0``)
    heldout_size:  held-out rows: the environment's eval dataset when it has one, else the
                   last rows of its dataset (then left out of training)

Training visits the training rows in a fresh order each epoch, drawn from the run's seed.
"""

from __future__ import annotations

import importlib
import itertools
import json
import random
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource
from streamrl.sources.environments import env_item, require

KIND = "verifiers"


@lru_cache(maxsize=8)
def _load(load: str, args_json: str) -> Any:
    vf = require("verifiers", KIND)
    args = json.loads(args_json)
    if ":" in load:
        module, _, name = load.partition(":")
        env = getattr(importlib.import_module(module), name)(**args)
    else:
        env = vf.load_environment(load, **args)
    if not isinstance(env, vf.Environment):
        raise ValueError(f"{load!r} returned {type(env).__name__}, not a vf.Environment")
    return env


def load_environment(spec: dict[str, Any]) -> Any:
    """The environment ``spec`` names (``load``, ``args``), built once per process."""
    return _load(str(spec["load"]), json.dumps(spec.get("args", {}), sort_keys=True))


def rows(env: Any, split: str) -> Any:
    """The environment's dataset of ``split`` (``train`` or ``eval``), or None."""
    if split == "eval":
        return env.get_eval_dataset() if env.eval_dataset_source is not None else None
    return env.get_dataset() if env.dataset_source is not None else None


class VerifiersTaskSource(TaskSource):
    def __init__(
        self,
        load: str,
        args: dict[str, Any] | None = None,
        demonstration: str | None = None,
        heldout_size: int = 100,
    ) -> None:
        self.demonstration = demonstration
        if heldout_size < 1:
            raise ValueError("heldout_size must be >= 1")
        self.spec = {"kind": KIND, "load": load, "args": dict(args or {})}
        try:
            env = load_environment(self.spec)
        except (ImportError, AttributeError, TypeError) as e:
            raise ValueError(f"load={load!r}: {type(e).__name__}: {e}") from None
        train, evals = rows(env, "train"), rows(env, "eval")
        if train is None or len(train) == 0:
            raise ValueError(f"load={load!r}: the environment has no training rows")
        n = len(train)
        if evals is not None and len(evals) > 0:
            self.train_rows = list(range(n))
            self.eval_rows = [("eval", k) for k in range(min(heldout_size, len(evals)))]
        else:
            if n <= heldout_size:
                raise ValueError(f"{n} rows leave none for training after {heldout_size} held out")
            self.train_rows = list(range(n - heldout_size))
            self.eval_rows = [("train", k) for k in range(n - heldout_size, n)]

    def _item(self, name: str, split: str, k: int, domain: str | None = None) -> Item:
        spec = {**self.spec, "split": split, "index": k}
        return env_item(f"{self.spec['load']}:{name}-{k}", spec, k, ["policy"], domain=domain)

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        for _ in itertools.count():
            order = list(self.train_rows)
            rng.shuffle(order)
            for k in order:
                item = self._item("train", "train", k)
                if self.demonstration is not None:
                    item.metadata["demonstration"] = self.demonstration
                    item.answer = ""  # (the supervised warm-start takes items with an answer)
                yield item

    def heldout(self, n: int | None = None) -> list[Item]:
        chosen = self.eval_rows if n is None else self.eval_rows[:n]
        return [self._item(split, split, k) for split, k in chosen]

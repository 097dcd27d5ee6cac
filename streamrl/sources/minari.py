"""Offline datasets (Minari) as a task source (``data.kind: minari``).

The dataset is read once with ``minari.load_dataset(id, download=False)`` (there is no
network: datasets are made locally with ``streamrl data make-minari``) and checked
step by step; every transition is kept in memory. A training item then *carries* its
trajectory: ``batch_transitions`` transitions drawn uniformly from the dataset, in
``item.metadata["transitions"]``. The gym episode (``rollout.episode: gym``)
returns them unchanged, so logged data goes through the same stream, accounting and
algorithm as online segments.

Offline-to-online: with ``offline_fraction < 1`` the first ``offline_items`` items
are logged, and after them a share ``offline_fraction`` of the items is logged and
the rest are online segment requests (``num_envs`` x ``segment_length`` steps, played
by the rollout worker with the current policy, as ``data.kind: gym``). The interleave
is exact and deterministic: item k is logged iff floor((k + 1) f) > floor(k f).
Held-out items are deterministic evaluation episodes of the dataset's environment.

Options:
    dataset_id:        the Minari id, e.g. "cartpole/medium-v0"
    batch_transitions: transitions per logged item
    env_id:            environment for evaluation and online play (default: the
                       dataset's own; its spaces must match the dataset's)
    env_options:       keyword arguments of ``gymnasium.make``
    offline_fraction:  share of logged items (1.0: offline only)
    offline_items:     logged-only items before the mix starts (the offline phase)
    num_envs, segment_length, vectorization: online segments, as ``data.kind: gym``
    heldout_size:      evaluation episodes
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.config.options import check_path_component
from streamrl.core.transitions import Transitions
from streamrl.core.types import Item
from streamrl.sources.base import DataError, TaskSource
from streamrl.sources.gym import GymTaskSource

MAKE_HINT = "streamrl data make-minari ENV_ID --policy RUN_DIR|random --episodes N --dataset-id {}"


def datasets_root() -> Path:
    """Where Minari keeps local datasets: $MINARI_DATASETS_PATH or ~/.minari/datasets."""
    root = os.environ.get("MINARI_DATASETS_PATH")
    return Path(root) if root else Path.home() / ".minari" / "datasets"


def load_minari(dataset_id: str) -> Any:
    """``minari.load_dataset(dataset_id, download=False)``; a missing dataset names the
    directory searched and the command that makes one."""
    import minari

    try:
        check_path_component(dataset_id, allow_slash=True)  # (a directory under the root)
    except ValueError as e:
        raise ValueError(f"dataset_id {dataset_id!r}: {e}") from None
    try:
        return minari.load_dataset(dataset_id, download=False)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"data.options.dataset_id={dataset_id!r}: no such Minari dataset in "
            f"{datasets_root()} (MINARI_DATASETS_PATH="
            f"{os.environ.get('MINARI_DATASETS_PATH', '<unset>')}); make it with "
            f"`{MAKE_HINT.format(dataset_id)}`"
        ) from None


def _key_line(path: Path, key: str) -> int | None:
    """The 1-based line of ``"key"`` in a JSON file (for error messages), if any."""
    try:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if f'"{key}"' in line:
                return i
    except OSError:
        pass
    return None


def check_spaces(dataset: Any, env_id: str, observation_space: Any, action_space: Any) -> None:
    """The dataset's spaces equal the environment's (else a DataError naming the
    dataset's metadata file, the line and the field)."""
    from streamrl.models.policies import space_spec

    meta = Path(dataset.spec.data_path) / "metadata.json"
    for name, ours in (("observation_space", observation_space), ("action_space", action_space)):
        theirs = getattr(dataset.spec, name)
        try:
            same = space_spec(theirs) == space_spec(ours)
        except ValueError as e:  # a space policies cannot handle (Dict, Tuple, ...)
            raise DataError(str(meta), str(e), line=_key_line(meta, name), field=name) from None
        if not same:
            raise DataError(
                str(meta),
                f"the dataset's {theirs} does not match {env_id}'s {ours}",
                line=_key_line(meta, name),
                field=name,
            )


def _episode_arrays(ep: Any, where: str, discrete: bool, n_actions: int) -> tuple:
    """One episode's checked arrays: obs (T+1, ...), actions, rewards, terminations."""
    obs = np.asarray(ep.observations, dtype=np.float32)
    actions = np.asarray(ep.actions)
    rewards = np.asarray(ep.rewards, dtype=np.float64)
    terms = np.asarray(ep.terminations, dtype=bool)
    t_len = len(rewards)
    if t_len == 0:
        raise DataError(where, "empty episode (no steps)", field="rewards")
    if len(obs) != t_len + 1 or len(actions) != t_len:
        raise DataError(
            where,
            f"{len(obs)} observations and {len(actions)} actions for {t_len} rewards "
            "(expected T + 1 and T)",
            field="observations",
        )
    for name, x in (("rewards", rewards), ("observations", obs), ("actions", actions)):
        if x.dtype.kind == "f":
            bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
            if bad.any():
                step = int(np.nonzero(bad)[0][0])
                raise DataError(where, f"not finite ({x[step]!r})", row=step, field=name)
    if discrete:
        bad = (actions < 0) | (actions >= n_actions) | (actions != np.round(actions))
        if bad.any():
            step = int(np.nonzero(bad)[0][0])
            raise DataError(
                where,
                f"{actions[step]!r} is not in Discrete({n_actions})",
                row=step,
                field="actions",
            )
    return obs, actions, rewards, terms


def read_transitions(dataset: Any, discrete: bool, n_actions: int) -> tuple[Transitions, dict]:
    """Every transition of the dataset (checked), and its episode statistics."""
    root = Path(dataset.spec.data_path)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "act", "rew", "next", "term")}
    returns: list[float] = []
    for i in dataset.episode_indices:  # one at a time: a bad episode is named alone
        where = str(root / str(int(i)))
        try:
            ep = next(iter(dataset.iterate_episodes([int(i)])))
        except Exception as e:  # a corrupt or hand-made file Minari cannot read
            raise DataError(where, f"unreadable episode: {type(e).__name__}: {e}") from None
        obs, actions, rewards, terms = _episode_arrays(ep, where, discrete, n_actions)
        parts["obs"].append(obs[:-1])
        parts["next"].append(obs[1:])
        parts["act"].append(actions)
        parts["rew"].append(rewards)
        parts["term"].append(terms)
        returns.append(float(rewards.sum()))
    if not returns:
        raise DataError(str(root), "the dataset has no episodes")
    obs = torch.as_tensor(np.concatenate(parts["obs"]))
    act = np.concatenate(parts["act"])
    data = Transitions(
        obs=obs,
        actions=torch.as_tensor(act.astype(np.int64) if discrete else act.astype(np.float32)),
        rewards=torch.as_tensor(np.concatenate(parts["rew"]), dtype=torch.float32),
        next_obs=torch.as_tensor(np.concatenate(parts["next"])),
        terminated=torch.as_tensor(np.concatenate(parts["term"])),
        versions=torch.full((obs.shape[0],), -1, dtype=torch.long),
    )
    stats = {
        "episodes": len(returns),
        "transitions": data.size,
        "return_mean": float(np.mean(returns)),
        "return_min": float(np.min(returns)),
        "return_max": float(np.max(returns)),
    }
    return data, stats


class MinariTaskSource(TaskSource):
    """See the module docstring."""

    def __init__(
        self,
        dataset_id: str,
        batch_transitions: int = 256,
        env_id: str | None = None,
        env_options: dict[str, Any] | None = None,
        offline_fraction: float = 1.0,
        offline_items: int = 0,
        num_envs: int = 4,
        segment_length: int = 64,
        vectorization: str = "sync",
        heldout_size: int = 10,
    ) -> None:
        if batch_transitions < 1:
            raise ValueError(
                f"data.options.batch_transitions must be >= 1, got {batch_transitions}"
            )
        if not 0.0 <= offline_fraction <= 1.0:
            raise ValueError(
                f"data.options.offline_fraction must be in [0, 1], got {offline_fraction}"
            )
        if offline_items < 0:
            raise ValueError(f"data.options.offline_items must be >= 0, got {offline_items}")
        self.dataset_id = dataset_id
        dataset = load_minari(dataset_id)
        if env_id is None:
            spec = dataset.spec.env_spec
            if spec is None:
                raise ValueError(
                    f"data.options.env_id: dataset {dataset_id!r} records no environment; "
                    "name the one to evaluate on"
                )
            env_id = spec.id
        self.env = GymTaskSource(
            env_id, env_options, num_envs, segment_length, vectorization, heldout_size
        )
        self.observation_space, self.action_space = (
            self.env.observation_space,
            self.env.action_space,
        )
        check_spaces(dataset, env_id, self.observation_space, self.action_space)
        discrete = type(self.action_space).__name__ == "Discrete"
        n_actions = int(self.action_space.n) if discrete else 0
        self.data, self.stats = read_transitions(dataset, discrete, n_actions)
        self.batch_transitions = batch_transitions
        self.offline_fraction, self.offline_items = offline_fraction, offline_items

    @property
    def phases(self) -> dict[str, int]:
        """Items of each phase that ends before the run does: {'offline': n} when online
        items follow the offline phase (the controller evaluates at its end)."""
        return {"offline": self.offline_items} if self.offline_fraction < 1.0 else {}

    def is_logged(self, k: int) -> bool:
        """Whether training item ``k`` carries logged data (else: an online segment)."""
        f = self.offline_fraction
        return k < self.offline_items or math.floor((k + 1) * f) > math.floor(k * f)

    def train_iter(self, seed: int) -> Iterator[Item]:
        gen = torch.Generator().manual_seed(seed)
        online = self.env.train_iter(seed)
        for k in itertools.count():
            if not self.is_logged(k):
                yield next(online)
                continue
            index = torch.randint(self.data.size, (self.batch_transitions,), generator=gen)
            yield Item(
                id=f"{self.dataset_id}:batch-{k}",
                metadata={"transitions": self.data.rows(index), "dataset_id": self.dataset_id},
            )

    def heldout(self, n: int | None = None) -> list[Item]:
        return self.env.heldout(n)

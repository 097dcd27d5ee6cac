"""Make a local Minari dataset by playing policies: ``streamrl data make-minari``.

    streamrl data make-minari CartPole-v1 --policy runs/cartpole --episodes 100
    streamrl data make-minari Pendulum-v1 --mix runs/pendulum:0.5 random:0.5 --episodes 50

A policy is a streamrl run directory (its ``model/``), a saved policy directory, or
``random`` (uniform actions from the action space). ``--mix SPEC:FRACTION ...`` splits
the episodes between several (an expert, a medium and a random policy, as D4RL's
medium-expert and medium-replay sets do). Trained policies sample their actions
(``--greedy``: the deterministic action; ``--epsilon E``: a random action at each step
with probability E, for a medium-quality set); continuous actions are clipped to the box,
and the clipped action is what is recorded, as the environment received it.

Episodes are recorded step by step into Minari's ``EpisodeBuffer`` and written with
``minari.create_dataset_from_buffers`` (the format Minari's ``DataCollector`` writes;
the DataCollector itself needs jax to append steps, which this path does not), in
Minari's Arrow format, under ``$MINARI_DATASETS_PATH`` (default ~/.minari/datasets).
Every argument (the dataset id, the environment, each policy) is checked before
anything is played or written; the dataset is built in a hidden directory next to its
place and swapped in whole (``--overwrite``: the old one is removed only once the new
one is in place), so a failure at any point leaves an existing dataset as it was.
Episode k of a dataset made with ``--seed s`` starts from ``reset(seed=100_000 (s + 1)
+ k)``, disjoint from the evaluation episodes' seeds (10_000 + i).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.core.atomic import (
    TMP_PREFIX,
    WriteError,
    fsync_tree,
    reason,
    remove,
    swap_directories,
)
from streamrl.sources.gym import make_env
from streamrl.sources.minari import datasets_root


@dataclass(frozen=True)
class PolicySpec:
    source: str  # 'random', a run directory or a policy directory
    fraction: float = 1.0


def parse_mix(specs: list[str]) -> list[PolicySpec]:
    """``["runs/a:0.5", "random:0.5"]`` -> specs whose fractions sum to 1.

    >>> [(s.source, s.fraction) for s in parse_mix(["runs/a:3", "random:1"])]
    [('runs/a', 0.75), ('random', 0.25)]
    """
    out = []
    for spec in specs:
        source, sep, frac = spec.rpartition(":")
        if not sep or not source:
            raise ValueError(f"--mix {spec!r}: expected POLICY:FRACTION, e.g. random:0.5")
        try:
            fraction = float(frac)
        except ValueError:
            raise ValueError(f"--mix {spec!r}: {frac!r} is not a number") from None
        if fraction <= 0:
            raise ValueError(f"--mix {spec!r}: the fraction must be > 0")
        out.append(PolicySpec(source, fraction))
    total = sum(s.fraction for s in out)
    return [PolicySpec(s.source, s.fraction / total) for s in out]


def split_episodes(episodes: int, specs: list[PolicySpec]) -> list[int]:
    """Episodes per spec, rounded so that they sum to ``episodes``.

    >>> split_episodes(10, [PolicySpec("a", 0.6), PolicySpec("b", 0.3), PolicySpec("c", 0.1)])
    [6, 3, 1]
    >>> split_episodes(3, [PolicySpec("a", 0.34), PolicySpec("b", 0.33), PolicySpec("c", 0.33)])
    [1, 1, 1]
    """
    cum = np.cumsum([s.fraction for s in specs])
    bounds = [0, *np.round(cum * episodes).astype(int).tolist()]
    bounds[-1] = episodes
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def load_actor(source: str, env: Any) -> Any:
    """A callable obs -> action for ``source`` on ``env`` (or None for 'random')."""
    from streamrl.models.policies import is_policy_dir, load_policy, space_spec

    if source == "random":
        return None
    path = Path(source).expanduser()
    if (path / "model").is_dir() and is_policy_dir(path / "model"):  # a run directory
        path = path / "model"
    if not is_policy_dir(path):
        raise FileNotFoundError(
            f"--policy {source}: neither 'random' nor a streamrl run directory or saved policy "
            "(no model/config.json with a streamrl policy)"
        )
    policy = load_policy(path).eval()
    for name, ours in (("observation", env.observation_space), ("action", env.action_space)):
        if policy.config[name] != space_spec(ours):
            raise ValueError(
                f"--policy {source}: its {name} space {policy.config[name]} does not match "
                f"{env.spec.id}'s {ours}"
            )
    return policy


def _default_id(env_id: str, specs: list[PolicySpec]) -> str:
    name = re.sub(r"-v\d+$", "", env_id).lower()
    kinds = {"random" if s.source == "random" else "policy" for s in specs}
    tag = kinds.pop() if len(kinds) == 1 and len(specs) == 1 else "mixed"
    return f"{name}/{tag}-v0"


def play_episode(
    env: Any, policy: Any, seed: int, greedy: bool, episode_id: int = 0, epsilon: float = 0.0
) -> Any:
    """One episode as a Minari EpisodeBuffer (observations T + 1, the rest T); with
    probability ``epsilon`` a step takes a uniformly random action instead."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    box = hasattr(env.action_space, "low")
    observations, actions, rewards, terms, truncs = [obs], [], [], [], []
    done, rng = False, np.random.default_rng(seed)
    while not done:
        if policy is None or (epsilon > 0 and rng.random() < epsilon):
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                out = policy.act(torch.as_tensor(np.asarray(obs)[None]), greedy=greedy)
            action = out["actions"][0].numpy()
            action = (
                np.clip(action, env.action_space.low, env.action_space.high) if box else int(action)
            )
        obs, reward, term, trunc, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(float(reward))
        terms.append(bool(term))
        truncs.append(bool(trunc))
        done = term or trunc
    return EpisodeBuffer(
        id=episode_id,
        seed=seed,
        observations=np.asarray(observations),
        actions=np.asarray(actions),
        rewards=rewards,
        terminations=terms,
        truncations=truncs,
        infos={},
    )


def make_minari(
    env_id: str,
    specs: list[PolicySpec],
    episodes: int,
    *,
    dataset_id: str | None = None,
    env_options: dict[str, Any] | None = None,
    seed: int = 0,
    greedy: bool = False,
    epsilon: float = 0.0,
    overwrite: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Play ``episodes`` episodes split between ``specs`` and save them as a Minari
    dataset; returns its id and a summary (episodes, steps, mean return per policy)."""
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"--epsilon must be in [0, 1], got {epsilon}")
    if env_options is not None and not isinstance(env_options, dict):
        raise ValueError(f"--env-options must be a JSON object, got {env_options!r}")
    dataset_id = dataset_id or _default_id(env_id, specs)
    _check_dataset_id(dataset_id)
    path = datasets_root() / dataset_id
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"dataset {dataset_id!r} already exists at {path}; pass --overwrite to replace it"
        )
    env = make_env(env_id, env_options)
    try:
        buffers, per_policy = _play_all(env, specs, episodes, seed, greedy, epsilon)
    finally:
        env.close()
    described = ", ".join(f"{s.source} ({s.fraction:.0%})" for s in specs)
    if epsilon > 0:
        described += f", {epsilon:.0%} random actions"
    with _staging(datasets_root()) as staging:
        with warnings.catch_warnings():  # no permalink or e-mail: a locally made dataset
            warnings.simplefilter("ignore", UserWarning)
            dataset = _create(
                dataset_id, buffers, env_id, env_options, env, described, greedy, seed
            )
        totals = dataset.total_episodes, dataset.total_steps
        del dataset  # it reads from the staging directory
        _install(staging, dataset_id)
    summary = {
        "dataset_id": dataset_id,
        "path": str(path),
        "episodes": totals[0],
        "steps": totals[1],
        "return_mean_by_policy": per_policy,
    }
    return dataset_id, summary


def _play_all(
    env: Any, specs: list[PolicySpec], episodes: int, seed: int, greedy: bool, epsilon: float
) -> tuple[list[Any], dict[str, float]]:
    """Every policy loaded first, then its share of the ``episodes``, each with its own
    seed; returns the episode buffers and each policy's mean return."""
    buffers: list[Any] = []
    per_policy: dict[str, float] = {}
    actors = [load_actor(spec.source, env) for spec in specs]  # every policy, first
    for spec, policy, n in zip(specs, actors, split_episodes(episodes, specs), strict=True):
        returns = []
        for _ in range(n):
            k = len(buffers)
            buf = play_episode(env, policy, 100_000 * (seed + 1) + k, greedy, k, epsilon)
            buffers.append(buf)
            returns.append(sum(buf.rewards))
        if returns:
            per_policy[spec.source] = float(np.mean(returns))
    return buffers, per_policy


def _check_dataset_id(dataset_id: str) -> None:
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # TypeError: Minari's parser, given no version
        raise ValueError(
            f"--dataset-id {dataset_id!r}: expected (namespace/)name-v<version>, e.g. "
            "cartpole/expert-v0"
        ) from None
    if any(part.startswith(".") for part in Path(dataset_id).parts):
        raise ValueError(f"--dataset-id {dataset_id!r}: no part may start with '.'")


@contextlib.contextmanager
def _staging(root: Path) -> Iterator[Path]:
    """A hidden Minari root next to ``root`` (so the finished dataset moves by rename),
    set as ``$MINARI_DATASETS_PATH`` while Minari writes into it; always removed."""
    staging = root / f"{TMP_PREFIX}make-minari-{os.getpid()}"
    before = os.environ.get("MINARI_DATASETS_PATH")
    try:
        remove(staging)
        staging.mkdir(parents=True)
        os.environ["MINARI_DATASETS_PATH"] = str(staging)
        yield staging
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(f"cannot write the dataset under {root}: {reason(e)}") from e
    finally:
        if before is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = before
        remove(staging)


def _install(staging: Path, dataset_id: str) -> None:
    """Move the dataset built under ``staging`` to its place, replacing an old one in one
    step, and add the namespace metadata Minari keeps beside it where missing."""
    root = staging.parent
    built, final = staging / dataset_id, root / dataset_id
    fsync_tree(built)
    for meta in staging.rglob("namespace_metadata.json"):
        target = root / meta.relative_to(staging)
        if not target.exists() and built not in meta.parents:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(meta, target)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        swap_directories(built, final)  # the old dataset is now at `built`, then removed
    else:
        built.rename(final)


def _create(
    dataset_id: str,
    buffers: list[Any],
    env_id: str,
    env_options: dict[str, Any] | None,
    env: Any,
    described: str,
    greedy: bool,
    seed: int,
) -> Any:
    """``minari.create_dataset_from_buffers`` in the Arrow format, with its provenance."""
    import minari

    spec = env_id if not env_options else env.spec
    return minari.create_dataset_from_buffers(
        dataset_id,
        buffers,
        env=spec,
        eval_env=spec,
        algorithm_name=f"streamrl make-minari: {described}",
        author="streamrl make-minari",
        description=f"{len(buffers)} episodes of {env_id} played by {described}"
        f"{' (greedy)' if greedy else ''}, seed {seed}",
        data_format="arrow",
    )

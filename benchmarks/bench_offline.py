"""streamrl's offline BC and IQL against d3rlpy's, on the same locally made Minari data.

    # the datasets (see docs/offline.md); then, with nothing else on the machine:
    PYTHONPATH=.:/tmp/d3rlpy_pkgs python benchmarks/bench_offline.py \\
        --dataset cartpole/medium-v0 --algos bc --seeds 0 1 2 3 4 --steps 5000
    PYTHONPATH=.:/tmp/d3rlpy_pkgs python benchmarks/bench_offline.py \\
        --dataset pendulum/medium-v0 --algos bc iql --seeds 0 1 2 3 4 --steps 5000

Both sides train on every transition of the dataset for ``--steps`` gradient steps of
``--batch`` transitions, with the same networks (two hidden layers of 256 ReLU units
in d3rlpy, of 256 tanh units in streamrl's policy; twin Q and V of 256 ReLU units),
the same hyperparameters (IQL: expectile 0.7, beta 3, max weight 100, tau 0.005,
lr 3e-4; BC: lr 1e-3) and one torch thread. ``--reward-scale c`` multiplies IQL's rewards
by c on both sides (streamrl: ``algorithm.offline.reward_scale``; d3rlpy: its
``MultiplyRewardScaler``). For Box actions d3rlpy gets a ``MinMaxActionScaler`` to the
environment's bounds: its policies end in tanh, so without it they can only play actions
in [-1, 1] (Pendulum's torque is in [-2, 2]). Both final policies are scored by the same
function: the mean return of ``--eval-episodes`` deterministic episodes from seeds
10_000 + i. Wall time is training only (streamrl: its RL stage, stream and controller
included; d3rlpy: ``fit``). d3rlpy has no discrete IQL, so CartPole compares BC only.

d3rlpy is a benchmark-only dependency and pins gymnasium 1.0 (streamrl needs >= 1.1):
install it beside the project's environment, not into it, with
``pip install --no-deps --target /tmp/d3rlpy_pkgs d3rlpy==2.8.1 dataclasses-json
marshmallow typing-inspect mypy_extensions structlog colorama gym==0.26.2 gym-notices
h5py scikit-learn joblib threadpoolctl`` and put that directory on PYTHONPATH.
Results: a JSON file (``--out``) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.config import load_config
from streamrl.models.policies import load_policy
from streamrl.run.launch import train
from streamrl.sources.gym import make_env
from streamrl.sources.minari import load_minari

HIDDEN = [256, 256]


def evaluate(act: Any, env_id: str, episodes: int) -> float:
    """Mean return of deterministic episodes; ``act(obs (obs_dim,)) -> action``."""
    env = make_env(env_id)
    box = hasattr(env.action_space, "low")
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 + i)
        total, done = 0.0, False
        while not done:
            a = act(np.asarray(obs, dtype=np.float32))
            a = np.clip(a, env.action_space.low, env.action_space.high) if box else int(a)
            obs, r, term, trunc, _ = env.step(a)
            total, done = total + float(r), bool(term or trunc)
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def run_streamrl(
    algo: str, dataset_id: str, seed: int, steps: int, batch: int, out: Path, reward_scale: float
):
    overrides = [
        f"seed={seed}", "model.name_or_path=mlp", f"model.options={{hidden: {HIDDEN}}}",
        "data.kind=minari", f"data.options={{dataset_id: {dataset_id}, batch_transitions: {batch}}}",
        "rollout.episode=gym", "rollout.group_size=1", f"algorithm.name={algo}",
        f"algorithm.offline.q_hidden={HIDDEN}", "algorithm.offline.gamma=0.99", "sft.steps=0",
        f"train.steps={steps}", "train.items_per_step=1", "train.max_grad_norm=1e6",
        f"train.lr={1e-3 if algo == 'bc' else 3e-4}", f"algorithm.offline.reward_scale={reward_scale}",
        "runtime.threads=1",
        "runtime.rollout_threads=1", "eval.every=0", "eval.heldout_size=1",
        f"run.output_dir={out}", f"run.name={algo}-{seed}", "run.progress=false",
        "run.tensorboard=false", "run.checkpoint_every=0",
    ]  # fmt: skip
    summary = train(load_config(None, overrides)).summary
    policy = load_policy(Path(summary["run_dir"]) / "model").eval()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy.act(torch.as_tensor(obs[None]), greedy=True)["actions"][0].numpy()

    return act, summary["rl_time_s"]


def d3rlpy_dataset(dataset_id: str) -> tuple[Any, str, bool, Any]:
    import d3rlpy

    ds = load_minari(dataset_id)
    obs, act, rew, term, trunc = [], [], [], [], []
    for ep in ds.iterate_episodes():
        obs.append(ep.observations[:-1])
        act.append(ep.actions)
        rew.append(ep.rewards)
        term.append(ep.terminations)
        trunc.append(ep.truncations)
    discrete = type(ds.spec.action_space).__name__ == "Discrete"
    data = d3rlpy.dataset.MDPDataset(
        np.concatenate(obs).astype(np.float32),
        np.concatenate(act),
        np.concatenate(rew).astype(np.float32),
        np.concatenate(term).astype(np.float32),
        np.concatenate(trunc).astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE if discrete else d3rlpy.ActionSpace.CONTINUOUS,
    )
    return data, ds.spec.env_spec.id, discrete, None if discrete else ds.spec.action_space


def run_d3rlpy(
    algo: str, data: Any, box: Any, seed: int, steps: int, batch: int, reward_scale: float
):
    """``box``: the Box action space (None for discrete actions)."""
    import d3rlpy
    from d3rlpy.logging import NoopAdapterFactory
    from d3rlpy.models.encoders import VectorEncoderFactory
    from d3rlpy.preprocessing import MinMaxActionScaler, MultiplyRewardScaler

    d3rlpy.seed(seed)
    enc = VectorEncoderFactory(hidden_units=HIDDEN)
    discrete = box is None
    scaler = {} if discrete else {"action_scaler": MinMaxActionScaler(box.low, box.high)}
    if algo == "bc":
        cls = d3rlpy.algos.DiscreteBCConfig if discrete else d3rlpy.algos.BCConfig
        config = cls(batch_size=batch, learning_rate=1e-3, encoder_factory=enc, **scaler)
    elif algo == "iql" and not discrete:
        config = d3rlpy.algos.IQLConfig(
            batch_size=batch, actor_encoder_factory=enc, critic_encoder_factory=enc,
            value_encoder_factory=enc, reward_scaler=MultiplyRewardScaler(reward_scale),
            **scaler,
        )  # fmt: skip
    else:
        raise ValueError(f"d3rlpy has no {algo} for {'discrete' if discrete else 'continuous'}")
    model = config.create(device="cpu:0")
    t0 = time.perf_counter()
    model.fit(
        data, n_steps=steps, n_steps_per_epoch=steps, show_progress=False,
        logger_adapter=NoopAdapterFactory(), save_interval=10**9,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    return (lambda obs: model.predict(obs[None])[0]), seconds


def summarize(rows: list[dict]) -> str:
    lines = [
        "| algo | library | seeds | return mean ± std | return per seed | train time s (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for algo in dict.fromkeys(r["algo"] for r in rows):
        for lib in ("streamrl", "d3rlpy"):
            rs = [r for r in rows if r["algo"] == algo and r["library"] == lib]
            if not rs:
                continue
            ret = [r["return"] for r in rs]
            sd = statistics.stdev(ret) if len(ret) > 1 else 0.0
            lines.append(
                f"| {algo} | {lib} | {len(rs)} | {statistics.mean(ret):.1f} ± {sd:.1f} | "
                f"{', '.join(f'{x:.0f}' for x in ret)} | "
                f"{statistics.mean(r['train_s'] for r in rs):.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help="a local Minari dataset id")
    p.add_argument("--algos", nargs="+", default=["bc", "iql"], choices=["bc", "iql"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=5000, help="gradient steps per run")
    p.add_argument("--batch", type=int, default=256, help="transitions per gradient step")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument(
        "--reward-scale", type=float, default=1.0, help="IQL rewards x this, both libraries"
    )
    p.add_argument("--libraries", nargs="+", default=["streamrl", "d3rlpy"])
    p.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = p.parse_args()
    torch.set_num_threads(1)
    data, env_id, discrete, box = d3rlpy_dataset(args.dataset) if "d3rlpy" in args.libraries else (
        None, load_minari(args.dataset).spec.env_spec.id, None, None,
    )  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            scale = args.reward_scale if algo == "iql" else 1.0  # BC reads no rewards
            for seed in args.seeds:
                for lib in args.libraries:
                    if lib == "d3rlpy" and algo == "iql" and discrete:
                        continue  # d3rlpy has no discrete IQL
                    if lib == "streamrl":
                        act, secs = run_streamrl(
                            algo, args.dataset, seed, args.steps, args.batch, Path(tmp), scale
                        )
                    else:
                        act, secs = run_d3rlpy(algo, data, box, seed, args.steps, args.batch, scale)
                    ret = evaluate(act, env_id, args.eval_episodes)
                    rows.append(
                        {"algo": algo, "library": lib, "seed": seed, "return": ret,
                         "train_s": secs, "reward_scale": scale}
                    )  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
    table = summarize(rows)
    print(f"\n{args.dataset}, {args.steps} gradient steps of {args.batch}\n\n{table}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""The PettingZoo example's return before and after training, over seeds.

    PYTHONPATH=. python benchmarks/bench_pettingzoo.py --seeds 0 1 2 3 4
    PYTHONPATH=. python benchmarks/bench_pettingzoo.py --policies per_agent --seeds 0 1 2

Each seed trains ``examples/pettingzoo.yaml`` (MPE simple_spread, two agents, PPO) in this
process; its return is the mean over the agents and over the 20 held-out deterministic
episodes, before RL (the fresh policy) and after. A uniformly random policy plays the same
held-out episodes as the reference. Prints a markdown table: the mean over seeds with a
95% Student-t interval. Results: benchmarks/results/envs.md; runs under runs/bench_pettingzoo/.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

from streamrl.config import load_config
from streamrl.run.launch import train
from streamrl.sources.pettingzoo import ParallelVectorEnv

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pettingzoo.yaml"
OUT = ROOT / "runs" / "bench_pettingzoo"


def interval(xs: list[float]) -> str:
    """mean [95% t interval] over seeds."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.1f}"
    half = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return f"{m:.1f} [{m - half:.1f}, {m + half:.1f}]"


def random_return(episodes: int, seed: int = 0) -> float:
    """A uniformly random policy's mean return on the held-out episodes (seeds 10000 + k)."""
    data = yaml.safe_load(EXAMPLE.read_text())["data"]["options"]
    env = ParallelVectorEnv(data["env_id"], data["env_options"], 1, False)
    rng = np.random.default_rng(seed)
    n = env.single_action_space.n
    totals = []
    for k in range(episodes):
        env.reset(seed=10_000 + k)
        ret, done = np.zeros(env.num_agents), False
        while not done:
            _, r, term, trunc, _ = env.step(rng.integers(0, n, env.num_envs))
            ret, done = ret + r, bool((term | trunc).any())
        totals.append(float(ret.mean()))
    return statistics.fmean(totals)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--policies", default="shared", choices=["shared", "per_agent"])
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides")
    args = ap.parse_args()
    before, after = [], []
    for seed in args.seeds:
        cfg = load_config(
            str(EXAMPLE),
            [
                f"seed={seed}",
                f"data.options.policies={args.policies}",
                f"run.output_dir={OUT / args.policies / f'seed{seed}'}",
                "run.progress=false",
                *args.set,
            ],
        )
        s = train(cfg).summary
        before.append(s["eval_return_before"])
        after.append(s["eval_return_after"])
        print(f"seed {seed}: {before[-1]:.1f} -> {after[-1]:.1f}", flush=True)
    heldout = yaml.safe_load(EXAMPLE.read_text())["eval"]["heldout_size"]
    print("\n| policies | seeds | random policy | before RL | after RL |\n|---|---|---|---|---|")
    print(
        f"| {args.policies} | {len(args.seeds)} | {random_return(heldout):.1f} | "
        f"{interval(before)} | {interval(after)} |"
    )
    print(
        "per seed (before -> after):",
        [f"{b:.1f} -> {a:.1f}" for b, a in zip(before, after, strict=True)],
    )


if __name__ == "__main__":
    main()

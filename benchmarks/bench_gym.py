"""streamrl against Stable-Baselines3 on Gymnasium environments, side by side.

    PYTHONPATH=. python benchmarks/bench_gym.py --seeds 0 1 2 3 4          # everything
    PYTHONPATH=. python benchmarks/bench_gym.py --part cartpole --seeds 0 1 2 3 4
    PYTHONPATH=. python benchmarks/bench_gym.py --part scaling
    ... --only sb3|streamrl --sb3-set n_epochs=10 --streamrl-set stream.max_staleness=0

Run it with nothing else on the machine; frameworks run one after the other.

- **CartPole-v1**: wall-clock training time until the mean return of 10 deterministic
  episodes reaches 475, evaluation time excluded (both sides evaluate every
  ``--eval-every`` environment steps and stop the clock while they do), and env steps/s.
- **Acrobot-v1, Pendulum-v1**: the final mean deterministic return after the zoo's
  budget of environment steps, compared with ``streamrl compare`` (IQM, CIs).
- **scaling**: env steps/s of streamrl with 1, 2 and 4 rollout workers on the process
  and Ray backends at eta = 1.

SB3 uses the RL Zoo's tuned PPO hyperparameters (read from the installed ``rl_zoo3``
package's ``hyperparams/ppo.yml``) and one torch thread. SB3 and rl_zoo3 are
benchmark-only dependencies: ``pip install stable-baselines3 && pip install --no-deps rl_zoo3``.
Results: benchmarks/results/gym.md; each run's directory under runs/bench_gym/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runs" / "bench_gym"
THRESHOLD = 475.0
EXAMPLES = {
    "CartPole-v1": "examples/cartpole.yaml",
    "Acrobot-v1": "examples/acrobot.yaml",
    "Pendulum-v1": "examples/pendulum.yaml",
}


def zoo_hyperparams(env_id: str) -> dict:
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None:
        sys.exit("needs the RL Zoo's hyperparameters: pip install --no-deps rl_zoo3")
    path = Path(next(iter(spec.submodule_search_locations))) / "hyperparams" / "ppo.yml"
    return dict(yaml.safe_load(path.read_text())[env_id])


def _schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def sb3_run(
    env_id: str,
    seed: int,
    eval_every: int,
    stop_at: float | None,
    budget: int | None = None,
    override: dict | None = None,
) -> dict:
    """SB3 PPO with zoo hyperparameters; clock stopped during evaluations. ``budget``
    replaces the zoo's number of environment steps (the same budget as streamrl's);
    ``override`` replaces zoo hyperparameters (``--sb3-set``; ``--streamrl-set`` overrides
    streamrl's example config the same way)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    hp = zoo_hyperparams(env_id) | (override or {})
    n_envs, total = int(hp.pop("n_envs", 1)), int(float(hp.pop("n_timesteps")))
    total = budget or total
    normalize = hp.pop("normalize", False)
    policy = hp.pop("policy")
    for key in ("learning_rate", "clip_range"):
        if key in hp:
            hp[key] = _schedule(hp[key])
    if "policy_kwargs" in hp and isinstance(hp["policy_kwargs"], str):
        hp["policy_kwargs"] = eval(hp["policy_kwargs"], {"nn": torch.nn, "dict": dict})  # noqa: S307 - zoo syntax
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99))
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
    model = PPO(policy, env, seed=seed, device="cpu", verbose=0, **hp)
    curve: list[tuple[int, float, float]] = []  # (env steps, train seconds, mean return)

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.train_s, self.t0, self.next_eval = 0.0, time.perf_counter(), eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.train_s += time.perf_counter() - self.t0
            self.next_eval += eval_every
            mean = evaluate()
            curve.append((self.num_timesteps, self.train_s, mean))
            self.t0 = time.perf_counter()
            return stop_at is None or mean < stop_at

    def evaluate() -> float:
        if normalize:
            eval_env.obs_rms = env.obs_rms
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
        return float(mean)

    clock = Clock()
    model.learn(total_timesteps=total, callback=clock)
    if not curve or curve[-1][0] < model.num_timesteps:  # the final policy's return
        clock.train_s += time.perf_counter() - clock.t0
        curve.append((model.num_timesteps, clock.train_s, evaluate()))
    reached = next(((s, t) for s, t, r in curve if stop_at is not None and r >= stop_at), None)
    return {
        "framework": "sb3",
        "env": env_id,
        "seed": seed,
        "train_s": clock.train_s,
        "env_steps": curve[-1][0] if curve else total,
        "steps_to_threshold": reached[0] if reached else None,
        "seconds_to_threshold": reached[1] if reached else None,
        "steps_per_s": (curve[-1][0] / clock.train_s) if curve and clock.train_s else None,
        "final_return": curve[-1][2] if curve else None,
        "curve": curve,
    }


def streamrl_run(
    env_id: str, seed: int, eval_every_steps: int, stop_at: float | None, extra: list[str]
) -> dict:
    """`streamrl train` on the example config; times from metrics.jsonl: the sum of
    ``time/step`` (generation wait, update, sync), evaluations excluded."""
    suffix = "".join("-" + x.split(".")[-1].replace("=", "") for x in extra)
    name = f"streamrl-{env_id}-s{seed}{suffix}"
    run_dir = OUT / name
    cfg = yaml.safe_load((ROOT / EXAMPLES[env_id]).read_text())
    per_step = (
        cfg["train"]["items_per_step"]
        * cfg["data"]["options"]["num_envs"]
        * cfg["data"]["options"]["segment_length"]
    )
    every = max(1, round(eval_every_steps / per_step))
    cmd = [
        sys.executable, "-m", "streamrl.cli.main", "train", EXAMPLES[env_id], f"seed={seed}",
        f"eval.every={every}", f"run.output_dir={OUT}", f"run.name={name}", "run.progress=false",
        "run.tensorboard=false", "run.checkpoint_every=0", *extra,
    ]  # fmt: skip
    if stop_at is not None:
        cmd.append(f"run.stop_at_eval={stop_at}")
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_s, curve = 0.0, []
    steps = 0
    for r in rows[1:]:
        train_s += r.get("time/step", 0.0)
        steps = int(r.get("env_steps_total", steps))
        if "eval/return" in r:
            curve.append((steps, train_s, r["eval/return"]))
    reached = next(((s, t) for s, t, ret in curve if stop_at is not None and ret >= stop_at), None)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "framework": "streamrl",
        "name": name,
        "env": env_id,
        "seed": seed,
        "train_s": train_s,
        "env_steps": steps,
        "steps_to_threshold": reached[0] if reached else None,
        "seconds_to_threshold": reached[1] if reached else None,
        "steps_per_s": steps / train_s if train_s else None,
        "final_return": summary.get("eval_return_after"),
        "curve": curve,
    }


def median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio_ci(sb3: list, ours: list, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap CI of median(ours) / median(sb3), seeds resampled with
    replacement on each side; a seed that never reached the threshold counts as infinite."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a, b = (np.array([np.inf if x is None else x for x in xs]) for xs in (ours, sb3))
    ra = np.median(rng.choice(a, (n, len(a))), axis=1)
    rb = np.median(rng.choice(b, (n, len(b))), axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return float(lo), float(hi)


BENCH_KEYS = ("seconds_to_threshold", "steps_to_threshold", "steps_per_s", "final_return")


def as_run_dir(r: dict) -> Path:
    """Make each result a run directory that ``streamrl compare`` reads: SB3's gets a
    config (framework, env, zoo hyperparameters), its curve and a summary; streamrl's own
    summary gets the benchmark's figures. Both under ``bench/<key>``."""
    figures = {f"bench/{k}": r[k] for k in BENCH_KEYS}
    if r["framework"] == "sb3":
        run_dir = OUT / f"sb3-{r['env']}-s{r['seed']}"
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {"framework": "sb3", "env": r["env"], "seed": r["seed"]}
        config["zoo"] = {k: str(v) for k, v in zoo_hyperparams(r["env"]).items()}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        rows = [
            {"step": i + 1, "env_steps_total": s, "eval/return": ret}
            for i, (s, _, ret) in enumerate(r["curve"])
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        summary = {"status": "completed", "eval_return_after": r["final_return"]}
    else:
        run_dir = OUT / r["name"]
        summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps(summary | figures, indent=2))
    return run_dir


def report(results: list[dict]) -> None:
    """Medians per framework: CartPole time to 475 (and the ratio), final returns."""
    for env_id in EXAMPLES:
        rows = [r for r in results if r["env"] == env_id and "backend" not in r]
        by = {fw: [r for r in rows if r["framework"] == fw] for fw in ("sb3", "streamrl")}
        by = {fw: rs for fw, rs in by.items() if rs}
        if not by:
            continue
        line = [f"{env_id}:"]
        for fw, rs in by.items():
            t = median([r["seconds_to_threshold"] for r in rs])
            hit = sum(r["seconds_to_threshold"] is not None for r in rs)
            sps = median([r["steps_per_s"] for r in rs])
            ret = median([r["final_return"] for r in rs])
            line.append(f"{fw} n={len(rs)} median final return {ret:.1f}, {sps:.0f} env steps/s")
            if env_id == "CartPole-v1":
                line.append(f"  median s to {THRESHOLD:.0f}: {t} ({hit}/{len(rs)} reached)")
        if env_id == "CartPole-v1" and len(by) == 2:
            a, b = (median([r["seconds_to_threshold"] for r in by[f]]) for f in ("streamrl", "sb3"))
            if a and b:
                lo, hi = ratio_ci(*([r["seconds_to_threshold"] for r in by[f]] for f in by))
                line.append(
                    f"  streamrl / SB3 median time ratio: {a / b:.2f}x (95% CI [{lo:.2f}, {hi:.2f}])"
                )
        print("\n".join(line))


def main() -> None:
    global OUT
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["cartpole", "final", "scaling", "all"], default="all")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--eval-every", type=int, default=4096, help="env steps between evaluations")
    for side, example in (("sb3", "n_epochs=10 learning_rate=lin_0.002"),
                          ("streamrl", "stream.max_staleness=0")):  # fmt: skip
        p.add_argument(
            f"--{side}-set", nargs="*", default=[], metavar="KEY=VALUE",
            help=f"overrides for {side}'s runs (SB3: zoo hyperparameters), e.g. {example}",
        )  # fmt: skip
    p.add_argument("--only", choices=["sb3", "streamrl"], help="run one side only")
    p.add_argument("--out", type=Path, default=OUT, help="results.jsonl and the run directories")
    args = p.parse_args()
    OUT = args.out.resolve()
    sb3_set = {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in args.sb3_set)}
    OUT.mkdir(parents=True, exist_ok=True)
    results_path = OUT / "results.jsonl"
    results = (
        [json.loads(x) for x in results_path.read_text().splitlines()]
        if results_path.exists()
        else []
    )

    def record(r: dict) -> None:
        if "backend" not in r:
            as_run_dir(r)
        results.append(r)
        with results_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}), flush=True)

    if args.part in ("cartpole", "all"):
        for seed in args.seeds:
            if args.only != "streamrl":
                record(sb3_run("CartPole-v1", seed, args.eval_every, THRESHOLD, None, sb3_set))
            if args.only != "sb3":
                record(
                    streamrl_run("CartPole-v1", seed, args.eval_every, THRESHOLD, args.streamrl_set)
                )
    if args.part in ("final", "all"):
        for env_id in ("Acrobot-v1", "Pendulum-v1"):
            cfg = yaml.safe_load((ROOT / EXAMPLES[env_id]).read_text())
            opts = cfg["data"]["options"]
            budget = cfg["train"]["steps"] * cfg["train"]["items_per_step"]
            budget *= opts["num_envs"] * opts["segment_length"]
            for seed in args.seeds:
                if args.only != "streamrl":
                    record(sb3_run(env_id, seed, 10**9, None, budget, sb3_set))
                if args.only != "sb3":
                    record(streamrl_run(env_id, seed, 10**9, None, args.streamrl_set))
    if args.part in ("scaling", "all"):
        for backend in ("process", "ray"):
            for workers in (1, 2, 4):
                extra = [
                    f"runtime.backend={backend}",
                    f"runtime.num_rollout_workers={workers}",
                    "stream.max_staleness=1",
                    "train.steps=60",
                    "eval.every=0",
                ]
                r = streamrl_run("CartPole-v1", 0, 10**9, None, extra)
                record(r | {"backend": backend, "workers": workers})
                print(f"{backend} x{workers}: {r['steps_per_s']:.0f} env steps/s", flush=True)
    report(results)
    print(f"results: {results_path}; compare with e.g.")
    print(f"  streamrl compare {OUT}/*Acrobot* --metric eval_return_after")


if __name__ == "__main__":
    main()

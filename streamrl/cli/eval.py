"""``streamrl eval RUN_DIR_OR_MODEL``: accuracy, pass@k and avg@k to JSON.

It runs the run's own episode (``rollout.episode``) through a fresh engine, greedily
by default, so items are evaluated exactly as they were trained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrl.analysis.evaluate import evaluate_model
from streamrl.config import load_config
from streamrl.core.atomic import distinct_paths
from streamrl.models import load_model
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.episodes.base import SamplesWith
from streamrl.rollout.rewards import build_reward
from streamrl.run.assembly import episode_spec
from streamrl.run.tracking import write_json
from streamrl.sources import build_task_source


def usable_ks(ks: list[int], n: int) -> tuple[int, ...]:
    """The k values pass@k can be estimated for from ``n`` samples per item; each larger
    one is reported on stderr (an error when none is left)."""
    kept = tuple(dict.fromkeys(k for k in ks if k <= n))
    if not kept:
        raise ValueError(f"--k {' '.join(map(str, ks))}: pass@k needs --n >= k (got --n {n})")
    for k in dict.fromkeys(k for k in ks if k > n):
        print(f"--k {k} ignored: larger than --n {n}", file=sys.stderr)
    return kept


def run_eval_command(args: argparse.Namespace) -> int:
    ks = usable_ks(args.k, args.n)  # (before anything is loaded)
    target = Path(args.target)
    is_run = (target / "config.yaml").exists()
    config_path = args.config or (target / "config.yaml" if is_run else None)
    out = Path(args.out) if args.out else (target / "eval.json" if is_run else Path("eval.json"))
    split = None if args.split == "heldout" else args.split
    distinct_paths({"--config": config_path, "--split": split}, {"--out": out})  # before work
    cfg = load_config(config_path, args.overrides)
    model_path = str(target / "model") if is_run else args.target
    if is_run and not (target / "model").exists():
        raise FileNotFoundError(
            f"{target} is a run directory without model/ (run.save_weights=false, or the "
            "run did not finish): nothing to evaluate"
        )
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    model, tokenizer = load_model(model_path, gguf_file=cfg.model.gguf_file, spaces=source.spaces())
    if args.split == "heldout":  # for an environment: --n ignored, each item is an episode
        items = source.heldout(cfg.eval.heldout_size)
    else:  # a prompt file: every row is evaluated
        kind = "parquet" if args.split.endswith(".parquet") else "jsonl"
        items = build_task_source(kind, path=args.split, heldout_fraction=1.0).heldout(None)
    temperature = (
        args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    )
    cfg.rollout.temperature = temperature
    episode = build_episode(
        episode_spec(cfg),
        tokenizer,
        build_reward(cfg.reward),
        max_new_tokens=cfg.eval.max_new_tokens,
    )
    result = evaluate_model(
        model,
        tokenizer,
        episode,
        items,
        cfg.reward.correct_reward,
        greedy=temperature == 0,
        samples_per_item=args.n,
        ks=ks,
        seed=cfg.seed,
    )
    write_json(
        out,
        {
            "target": str(target),
            "split": args.split,
            "sampling": vars(episode.sampling) if isinstance(episode, SamplesWith) else {},
            "metrics": result.metrics,
            "items": result.items,
        },
    )
    for key, value in result.metrics.items():
        print(f"{key:>16}: {value:.4f}" if isinstance(value, float) else f"{key:>16}: {value}")
    print(f"per-item outcomes: {out}", file=sys.stderr)
    return 0

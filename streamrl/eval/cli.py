"""``streamrl eval RUN_DIR_OR_MODEL``: accuracy, pass@k and avg@k to JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrl.config import load_config
from streamrl.controller import build_reward
from streamrl.data import build_task_source
from streamrl.eval.evaluate import evaluate
from streamrl.models import load_model_and_tokenizer
from streamrl.tracking import write_json
from streamrl.types import SamplingParams


def run_eval_command(args: argparse.Namespace) -> int:
    target = Path(args.target)
    is_run = (target / "config.yaml").exists()
    config_path = args.config or (target / "config.yaml" if is_run else None)
    cfg = load_config(config_path, args.overrides)
    model_path = str(target / "model") if is_run else args.target
    model, tokenizer = load_model_and_tokenizer(model_path, gguf_file=cfg.model.gguf_file)
    if args.split == "heldout":
        source = build_task_source(cfg.data.kind, **cfg.data.options)
        items = source.heldout(cfg.eval.heldout_size)
    else:  # a prompt file: every row is evaluated
        kind = "parquet" if args.split.endswith(".parquet") else "jsonl"
        items = build_task_source(kind, path=args.split, heldout_fraction=1.0).heldout(None)
    temperature = (
        args.temperature if args.temperature is not None else (0.0 if args.n == 1 else 1.0)
    )
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    params = SamplingParams(
        temperature=temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        stop=list(cfg.rollout.stop),
        stop_token_ids=eos,
    )
    result = evaluate(
        model,
        tokenizer,
        items,
        build_reward(cfg.reward),
        cfg.reward.correct_reward,
        params,
        n_samples=args.n,
        ks=tuple(args.k),
        seed=cfg.seed,
    )
    out = Path(args.out) if args.out else (target / "eval.json" if is_run else Path("eval.json"))
    write_json(
        out,
        {
            "target": str(target),
            "split": args.split,
            "sampling": vars(params),
            "metrics": result.metrics,
            "items": result.items,
        },
    )
    for key, value in result.metrics.items():
        print(f"{key:>16}: {value:.4f}" if isinstance(value, float) else f"{key:>16}: {value}")
    print(f"per-item outcomes: {out}", file=sys.stderr)
    return 0

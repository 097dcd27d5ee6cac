"""A quick RL run on the ``tiny-small`` preset, shared by tests that push one real run
through the controller."""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.algorithms import Algorithm, build_algorithm
from streamrl.config import Config, RunContext, load_config

QUIET_TINY = [
    "model.name_or_path=tiny-small",
    "sft.steps=0",
    "eval.every=0",
    "eval.heldout_size=4",
    "run.progress=false",
    "run.tensorboard=false",
    "run.save_weights=false",
]


def tiny_rl_config(output_dir: Path, *overrides: str) -> Config:
    """No SFT, 4 held-out items evaluated before and after, no progress bar, TensorBoard
    or saved weights; ``overrides`` (dotted ``key=value``) come after these."""
    return load_config(None, [*QUIET_TINY, f"run.output_dir={output_dir}", *overrides])


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def algorithm_of(cfg: Config) -> Algorithm:
    """The run's algorithm, built as the controller builds it: from its own section and
    the few values of other sections it needs."""
    return build_algorithm(cfg.algorithm, RunContext.of(cfg))

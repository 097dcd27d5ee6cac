"""A quick RL run on the ``tiny-small`` preset: the one way tests get a tiny run's config.

Tests take the ``tiny_config`` fixture (tests/conftest.py), bound to their ``tmp_path``;
shared helper modules call ``tiny_rl_config`` / ``tiny_args`` with an explicit directory.
Each test adds only the overrides it is about."""

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


def tiny_args(output_dir: Path | str, *overrides: str) -> list[str]:
    """The dotted ``key=value`` overrides of a tiny run writing under ``output_dir``: no
    SFT, 4 held-out items evaluated before and after, no progress bar, TensorBoard or
    saved weights; ``overrides`` come after these, so they win."""
    return [*QUIET_TINY, f"run.output_dir={output_dir}", *overrides]


def tiny_rl_config(output_dir: Path | str, *overrides: str) -> Config:
    """``tiny_args`` loaded as a config."""
    return load_config(None, tiny_args(output_dir, *overrides))


class TinyConfig:
    """What the ``tiny_config`` fixture gives: ``tiny_config(*overrides)`` is a tiny run's
    ``Config`` writing under the test's ``tmp_path`` (or ``output_dir=``), and
    ``tiny_config.args(*overrides)`` the same run as command-line overrides."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir

    def __call__(self, *overrides: str, output_dir: Path | None = None) -> Config:
        return tiny_rl_config(output_dir or self.output_dir, *overrides)

    def args(self, *overrides: str, output_dir: Path | None = None) -> list[str]:
        return tiny_args(output_dir or self.output_dir, *overrides)


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def algorithm_of(cfg: Config) -> Algorithm:
    """The run's algorithm, built as the controller builds it: from its own section and
    the few values of other sections it needs."""
    return build_algorithm(cfg.algorithm, RunContext.of(cfg))

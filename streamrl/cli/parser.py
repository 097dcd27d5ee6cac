"""The command line's surface: every command's arguments and help.

:func:`build_parser` takes the function that runs each command (:mod:`streamrl.cli.main`
holds them), keyed by the command's name (``data make-minari``: ``make-minari``;
``sandbox run`` and ``sandbox check``: ``sandbox``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

Command = Callable[[argparse.Namespace], int]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})")
    return value


def finite_float(low: float = -math.inf, high: float = math.inf) -> Any:
    """argparse type: a finite number in [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            bounds = (
                f" in [{low}, {high}]"
                if math.isfinite(high)
                else (f" >= {low}" if math.isfinite(low) else "")
            )
            raise argparse.ArgumentTypeError(f"expected a finite number{bounds} (got {text!r})")
        return value

    return parse


def add_import_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a Python module first (it registers task sources, rewards, ...); "
        "repeatable; train, serve, sweep and config add it to the config's plugins",
    )


def build_parser(commands: dict[str, Command], description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamrl", description=description)
    # what a command without these arguments leaves in the namespace
    p.set_defaults(imports=[], overrides=None)
    sub = p.add_subparsers(dest="command", required=True)
    for add in (add_train, add_serve, add_eval, add_compare, add_sweep, add_plot):
        add(sub, commands)
    add_data(sub, commands)
    add_config(sub, commands)
    add_sandbox(sub, commands)
    return p


Subparsers = Any  # argparse's _SubParsersAction


def add_train(sub: Subparsers, commands: dict[str, Command]) -> None:
    t = sub.add_parser("train", help="SFT warm-start + asynchronous RL, writes a run directory")
    t.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=10")
    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its latest checkpoint, with its own config",
    )
    add_import_option(t)
    t.set_defaults(func=commands["train"])


def add_serve(sub: Subparsers, commands: dict[str, Command]) -> None:
    sv = sub.add_parser(
        "serve",
        help="train from external agents: an OpenAI-compatible endpoint (sessions, rewards)",
    )
    sv.add_argument("config", nargs="?", help="YAML config (default: the main job's model)")
    sv.add_argument("overrides", nargs="*", help="dotted overrides, e.g. endpoint.port=8000")
    sv.add_argument("--resume", metavar="RUN_DIR", help="continue a served run")
    sv.add_argument(
        "--api",
        choices=["openai", "tinker"],
        default="openai",
        help="openai: train from external agents' sessions (default); tinker: the Tinker "
        "training API (LoRA runs driven by the `tinker` client, tinker.* keys)",
    )
    add_import_option(sv)
    sv.set_defaults(func=commands["serve"])


def add_eval(sub: Subparsers, commands: dict[str, Command]) -> None:
    e = sub.add_parser("eval", help="held-out accuracy, pass@k and avg@k of a run or model")
    e.add_argument("target", help="a run directory (uses its config and model/) or a model")
    e.add_argument("--config", help="config for the task/rewards (default: the run's)")
    e.add_argument(
        "--n", type=positive_int, default=1, help="samples per item (pass@k needs n >= k)"
    )
    e.add_argument(
        "--k",
        type=positive_int,
        nargs="+",
        default=[1],
        help="k values for pass@k; one larger than --n is reported and left out (an error "
        "when none is left)",
    )
    e.add_argument(
        "--temperature", type=finite_float(0.0), default=None, help="default: 0 if n=1 else 1"
    )
    e.add_argument("--split", default="heldout", help="'heldout' (default) or a prompt file")
    e.add_argument("--out", help="JSON output path (default: RUN_DIR/eval.json or ./eval.json)")
    e.add_argument("overrides", nargs="*", help="dotted config overrides")
    add_import_option(e)
    e.set_defaults(func=commands["eval"])


def add_compare(sub: Subparsers, commands: dict[str, Command]) -> None:
    c = sub.add_parser("compare", help="statistically compare groups of runs (rliable, AdaStop)")
    c.add_argument("runs", nargs="+", help="run directories, or parents of run directories")
    c.add_argument("--metric", default="eval_accuracy_after", help="summary or metrics key")
    c.add_argument("--out", help="directory for comparison.md and plots")
    c.add_argument("--format", choices=["table", "markdown", "json"], default="table")
    c.add_argument(
        "--fit",
        choices=["sigmoid"],
        help="fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) per recipe (ScaleRL) and plot it",
    )
    c.add_argument(
        "--compute",
        default="step",
        help="x axis of --fit: step, wall_time, a cumulative key, or sum:KEY (default: step)",
    )
    c.set_defaults(func=commands["compare"])


def add_sweep(sub: Subparsers, commands: dict[str, Command]) -> None:
    sw = sub.add_parser("sweep", help="one config over several seeds (then `streamrl compare`)")
    sw.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    sw.add_argument("overrides", nargs="*", help="dotted overrides shared by every seed")
    sw.add_argument("--seeds", nargs="+", required=True, help="seeds to run, e.g. 0 1 2 3 4")
    add_import_option(sw)
    sw.add_argument(
        "--parallel", type=positive_int, default=1, help="run N seeds at a time as subprocesses"
    )
    sw.set_defaults(func=commands["sweep"])


def add_plot(sub: Subparsers, commands: dict[str, Command]) -> None:
    pl = sub.add_parser("plot", help="PNG of a run's reward, eval accuracy and staleness")
    pl.add_argument("run_dir")
    pl.add_argument("--out", help="default: RUN_DIR/curves.png")
    pl.set_defaults(func=commands["plot"])


def add_data(sub: Subparsers, commands: dict[str, Command]) -> None:
    dt = sub.add_parser("data", help="make data sets (offline RL)")
    dtsub = dt.add_subparsers(dest="data_command", required=True)
    add_make_minari(dtsub, commands)
    add_log_completions(dtsub, commands)


def add_make_minari(sub: Subparsers, commands: dict[str, Command]) -> None:
    mm = sub.add_parser(
        "make-minari", help="play policies in an environment and save a local Minari dataset"
    )
    mm.add_argument("env_id", help="Gymnasium id, e.g. CartPole-v1")
    mm.add_argument("--policy", help="'random', a run directory or a saved policy directory")
    mm.add_argument(
        "--mix",
        nargs="+",
        metavar="POLICY:FRACTION",
        help="several policies and their share of the episodes, e.g. runs/a:0.5 random:0.5",
    )
    mm.add_argument("--episodes", type=positive_int, required=True, help="episodes to record")
    mm.add_argument("--dataset-id", help="Minari id (default: <env>/<random|policy|mixed>-v0)")
    mm.add_argument("--env-options", help="JSON keyword arguments of gymnasium.make")
    mm.add_argument("--seed", type=int, default=0, help="seeds the episodes' resets")
    mm.add_argument("--greedy", action="store_true", help="deterministic policy actions")
    mm.add_argument(
        "--epsilon",
        type=finite_float(0.0, 1.0),
        default=0.0,
        help="probability of a random action per step",
    )
    mm.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    mm.set_defaults(func=commands["make-minari"])


def add_log_completions(sub: Subparsers, commands: dict[str, Command]) -> None:
    lc = sub.add_parser(
        "log-completions",
        help="sample a model's completions of the task's training prompts, with rewards "
        "(alol.path), and optionally preference pairs (dpo.path)",
    )
    lc.add_argument("target", help="a run directory (its config and model/) or a model")
    lc.add_argument("--out", required=True, help="JSONL of {prompt, completion, reward} rows")
    lc.add_argument("--n", type=positive_int, default=4, help="completions per prompt")
    lc.add_argument("--prompts", type=positive_int, default=256, help="training prompts to log")
    lc.add_argument("--config", help="config for the task and reward (default: the run's)")
    lc.add_argument("--temperature", type=finite_float(0.0), help="default: rollout.temperature")
    lc.add_argument("--preferences", help="also write {prompt, chosen, rejected} pairs here")
    lc.add_argument("overrides", nargs="*", help="dotted config overrides")
    add_import_option(lc)
    lc.set_defaults(func=commands["log-completions"])


def add_config(sub: Subparsers, commands: dict[str, Command]) -> None:
    cf = sub.add_parser("config", help="print the resolved config, or the reference of all keys")
    cf.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    cf.add_argument("overrides", nargs="*", help="dotted overrides")
    cf.add_argument(
        "--reference", action="store_true", help="Markdown reference of every key (docs/config.md)"
    )
    add_import_option(cf)
    cf.set_defaults(func=commands["config"])


def add_sandbox(sub: Subparsers, commands: dict[str, Command]) -> None:
    sb = sub.add_parser("sandbox", help="run model-written code as the python tool does")
    sbsub = sb.add_subparsers(dest="sandbox_command", required=True)
    sbr = sbsub.add_parser("run", help="run FILE.py in the sandbox, print one JSON result")
    sbr.add_argument("file", help="the Python program")
    sbr.add_argument(
        "--timeout", type=finite_float(0.001), default=10.0, help="wall clock limit (s)"
    )
    sbc = sbsub.add_parser("check", help="print the isolation this machine gives, as JSON")
    for parser in (sbr, sbc):
        parser.add_argument(
            "--isolation",
            choices=["strong", "weak"],
            default="strong",
            help="weak: rlimits and a cgroup, no namespaces, seccomp or uid change (unsafe)",
        )
        parser.add_argument(
            "--cgroup",
            choices=["auto", "required", "off"],
            default="auto",
            help="a cgroup per run: where the host allows (auto), or else an error (required)",
        )
        parser.set_defaults(func=commands["sandbox"])

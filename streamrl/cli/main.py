"""Command line: ``streamrl train | eval | compare | sweep | plot | config``.

streamrl train [CONFIG.yaml] [key=value ...] [--import MODULE ...]
streamrl serve [CONFIG.yaml] [key=value ...] [--api openai|tinker]
streamrl eval RUN_DIR_OR_MODEL [--config CONFIG] [--n 8 --k 1 4 8] [key=value ...]
streamrl compare RUN_DIRS... --metric NAME [--out DIR]
streamrl sweep CONFIG --seeds 0 1 2 [key=value ...] [--parallel N]
streamrl plot RUN_DIR [--out PNG]
streamrl config [CONFIG.yaml] [key=value ...] [--reference]
streamrl data make-minari ENV_ID --policy RUN_DIR|random --episodes N [--dataset-id ID]
streamrl data log-completions RUN_DIR_OR_MODEL --out FILE.jsonl [--n 4 --prompts 256]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from streamrl.cli import parser as parse
from streamrl.cli.console import tolerate_a_closed_console
from streamrl.config import ConfigError, load_config
from streamrl.config.options import check_path_component
from streamrl.config.plugins import import_plugins
from streamrl.run.progress import Progress


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors a user can fix (anything else is a bug and keeps its traceback).
    Imported only when an error occurs, so `streamrl config` starts fast."""
    from streamrl.run.checkpoint import CheckpointError
    from streamrl.run.launch import TrainerFailed
    from streamrl.stream.pool import EpisodesFailing, WorkersUnreachable

    return (
        ConfigError,
        ValueError,  # PreflightError, DataError, usage
        OSError,  # FileNotFoundError, PermissionError, ConnectionError, a full disk
        EpisodesFailing,
        WorkersUnreachable,
        CheckpointError,
        TrainerFailed,
        ImportError,  # an optional extra that is not installed
    )


def split_config_arg(args: argparse.Namespace) -> None:
    """``streamrl train key=value ...`` (no config file): the first word is an override."""
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides = [args.config, *args.overrides]
        args.config = None


def cmd_serve(args: argparse.Namespace) -> int:
    """``streamrl train`` with the endpoint on. With no config file it serves the main
    job's model at once: its trained weights (runs/default/model) if they exist, without
    SFT, so it starts in seconds. ``--api tinker`` serves the Tinker training API instead."""
    split_config_arg(args)
    if args.api == "tinker":
        return cmd_serve_tinker(args)
    quick = []
    if args.config is None and not args.resume:
        quick = ["sft.steps=0", "eval.every=0", "eval.heldout_size=50"]
        if os.path.isfile(os.path.join("runs", "default", "model", "config.json")):
            quick.append("model.name_or_path=runs/default/model")
    args.overrides = [*quick, *args.overrides, "endpoint.enabled=true"]
    return cmd_train(args)


def cmd_serve_tinker(args: argparse.Namespace) -> int:
    """The Tinker API (``tinker.*`` keys) until SIGINT or SIGTERM."""
    import signal
    import threading

    try:
        import tinker  # noqa: F401
    except ImportError:
        raise ImportError(
            "--api tinker needs the Tinker client: pip install -e '.[tinker]' (scripts/setup.sh)"
        ) from None
    from streamrl.stream.endpoint.tinker.server import TinkerServer

    if args.resume:
        raise ConfigError(
            "--resume is for served RL runs; Tinker checkpoints resume from the client"
        )
    cfg = load_config(args.config, args.overrides, args.imports)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = TinkerServer(cfg.tinker, seed=cfg.seed)
    server.start()
    served = ", ".join(m.path for m in server.service.bases.models)
    print(
        f"streamrl: Tinker API at {server.base_url} (API key in {server.state_dir / 'tinker_token'})"
    )
    print(f"streamrl: base models: {served}", flush=True)
    try:
        while not stop.wait(0.5) and server.running:
            pass
    finally:
        server.stop()
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from streamrl.run.launch import resume_config, train
    from streamrl.run.signals import GracefulStop

    split_config_arg(args)
    if args.resume:
        if args.config:  # `--resume RUN_DIR key=value`: the first override looked like a file
            raise ConfigError(
                f"--resume continues {args.resume} with its own config; got a config file "
                f"{args.config!r} too (only key=value overrides may follow)"
            )
        cfg = resume_config(args.resume, args.overrides)
    else:
        cfg = load_config(args.config, args.overrides, args.imports)
    os.environ["STREAMRL_ARGV"] = " ".join(sys.argv)
    with GracefulStop() as stop, Progress(cfg.run.progress) as progress:
        result = train(cfg, progress=progress, resume_dir=args.resume, stop=stop)
    if result.already_completed:
        print(f"{result.run_dir} is complete (summary.json: completed); nothing to resume")
        return 0
    s = result.summary
    print(f"run directory: {result.run_dir}")
    times = f"(wall time {s['wall_time_s']:.0f}s, RL {s['rl_time_s']:.0f}s)"
    if "eval_return_before" in s:
        print(
            f"mean return of deterministic episodes: before RL {s['eval_return_before']:.1f} "
            f"-> after RL {s['eval_return_after']:.1f}  {times}"
        )
    else:
        print(
            f"held-out greedy accuracy: before RL {s['eval_accuracy_before']:.3f} -> "
            f"after RL {s['eval_accuracy_after']:.3f}  {times}"
        )
        if "eval_sampled_accuracy_after" in s:
            print(
                "held-out sampled accuracy (eval.samples at the rollout temperature): "
                f"before RL {s['eval_sampled_accuracy_before']:.3f} -> "
                f"after RL {s['eval_sampled_accuracy_after']:.3f}"
            )
        stages = [k for k in ("sft", "dpo", "alol") if f"eval_accuracy_after_{k}" in s]
        if len(stages) > 1:  # offline stages ran: the accuracy after each one
            chain = [f"{k.upper()} {s[f'eval_accuracy_after_{k}']:.3f}" for k in stages]
            chain.append(f"RL {s['eval_accuracy_after']:.3f}")
            print(f"  after each stage: {' -> '.join(chain)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from streamrl.cli.eval import run_eval_command

    return run_eval_command(args)


def cmd_compare(args: argparse.Namespace) -> int:
    if args.fit == "sigmoid":
        from streamrl.analysis.fit import run_fit

        return run_fit(args.runs, args.metric, args.compute, args.out, fmt=args.format)
    from streamrl.analysis.compare import run_compare

    return run_compare(args.runs, args.metric, args.out, fmt=args.format)


def cmd_plot(args: argparse.Namespace) -> int:
    from streamrl.analysis.run_plot import plot_run

    print(plot_run(args.run_dir, args.out))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from streamrl.run.sweep import run_sweep

    split_config_arg(args)
    # `--seeds 0 1 k=v` also swallows the overrides after it: give them back
    seeds, overrides = [], list(args.overrides)
    for word in args.seeds:
        if "=" in word:
            overrides.append(word)
        elif word.lstrip("-").isdigit():
            seeds.append(int(word))
        else:
            raise ValueError(f"--seeds: {word!r} is not an integer seed (nor a key=value)")
    if not seeds:
        raise ValueError("--seeds: give at least one seed, e.g. --seeds 0 1 2")
    if args.imports:  # every seed's config (and subprocess) imports them too
        plugins = load_config(args.config, overrides, args.imports).plugins
        overrides.append(f"plugins={json.dumps(plugins)}")
    return run_sweep(args.config, seeds, overrides, parallel=args.parallel)


def cmd_make_minari(args: argparse.Namespace) -> int:
    """``streamrl data make-minari``: a local Minari dataset played by policies."""
    import json

    from streamrl.sources.minari_make import PolicySpec, make_minari, parse_mix

    if (args.policy is None) == (args.mix is None):
        raise ValueError("make-minari: give exactly one of --policy and --mix")
    if args.dataset_id is not None:  # a directory under Minari's root, never elsewhere
        try:
            check_path_component(args.dataset_id, allow_slash=True)
        except ValueError as e:
            raise ValueError(f"--dataset-id {args.dataset_id!r}: {e}") from None
    specs = parse_mix(args.mix) if args.mix else [PolicySpec(args.policy)]
    env_options = json.loads(args.env_options) if args.env_options else None
    _, summary = make_minari(
        args.env_id,
        specs,
        args.episodes,
        dataset_id=args.dataset_id,
        env_options=env_options,
        seed=args.seed,
        greedy=args.greedy,
        epsilon=args.epsilon,
        overwrite=args.overwrite,
    )
    print(json.dumps(summary, indent=2))
    return 0


def cmd_log_completions(args: argparse.Namespace) -> int:
    """``streamrl data log-completions``: a model's scored completions (A-LoL, DPO data)."""
    from streamrl.run.log_completions import run_log_completions

    result = run_log_completions(
        args.target,
        args.out,
        n=args.n,
        prompts=args.prompts,
        config=args.config,
        overrides=args.overrides,
        temperature=args.temperature,
        preferences=args.preferences,
    )
    rewards = [r["reward"] for r in result.rows]
    mean = sum(rewards) / max(len(rewards), 1)
    print(f"{len(rewards)} completions (mean reward {mean:.3f}) -> {args.out}")
    if args.preferences:
        print(f"{len(result.pairs)} preference pairs -> {args.preferences}")
    if result.failed:
        print(f"{result.failed} completions left out: their episode or reward failed")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from streamrl.config import config_reference, save_config

    if args.reference:
        print(config_reference(), end="")  # the text of docs/config.md
        return 0
    split_config_arg(args)
    save_config(load_config(args.config, args.overrides, args.imports), "/dev/stdout")
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """``run``: a file as the agent's ``python`` tool would; one JSON object on stdout.
    Exit 0 whenever the sandbox worked: the JSON says what the code did. ``check``: what
    isolation this machine gives (a test program's result, and the cgroup support).
    A sandbox that cannot start is one error line naming the cause, exit 2."""
    import json

    from streamrl.rollout.sandbox import Sandbox, SandboxError, check, support

    options = {"isolation": args.isolation, "cgroup": args.cgroup}
    try:
        if args.sandbox_command == "check":
            result = check(**options)
            report = {k: v for k, v in result.to_json().items() if k not in ("stdout", "stderr")}
            print(json.dumps({"level": result.level, **report, "cgroup_support": support().note}))
            return 0
        result = Sandbox(timeout_s=args.timeout, **options).run_file(args.file)
    except SandboxError as e:
        print(f"error: the sandbox could not start: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json()))
    return 0


COMMANDS = {
    "train": cmd_train,
    "serve": cmd_serve,
    "eval": cmd_eval,
    "compare": cmd_compare,
    "sweep": cmd_sweep,
    "plot": cmd_plot,
    "make-minari": cmd_make_minari,
    "log-completions": cmd_log_completions,
    "config": cmd_config,
    "sandbox": cmd_sandbox,
}


def build_parser() -> argparse.ArgumentParser:
    return parse.build_parser(COMMANDS, description=__doc__.split("\n")[0])


def main(argv: list[str] | None = None) -> int:
    tolerate_a_closed_console()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `key=value` overrides may also come after options (streamrl eval RUN --n 4 a.b=1)
    if extra:
        if args.overrides is None or any("=" not in e or e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    from streamrl.run.signals import Interrupted

    try:
        import_plugins(args.imports, lambda i: "--import")
        return args.func(args)
    except Interrupted as e:
        print(f"streamrl: {e}", file=sys.stderr)
        return e.exit_code
    except user_errors() as e:
        # config, preflight, data (DataError names file:line: field) and environment
        # errors: one line (a config error lists each bad key on its own line)
        print(f"error: {user_message(e)}", file=sys.stderr)
        return 2


def user_message(e: BaseException) -> str:
    return str(e).strip() or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())

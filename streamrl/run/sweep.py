"""`streamrl sweep`: one config over several seeds, ready for `streamrl compare`.

    streamrl sweep examples/smoke.yaml --seeds 0 1 2 3 4 train.steps=50 [--parallel 2]

Seed S runs with ``seed=S`` and ``run.name=<name>-s<S>``, all in one
``run.output_dir`` (default ``runs/<config stem>``), so the runs differ only in the keys
`streamrl compare` ignores and land in one recipe group. By default the seeds run one
after another in this process; ``--parallel N`` runs N at a time as subprocesses, each
with ``runtime.threads`` set so that N x threads <= cores. A failing seed is reported
and the others still run; the exit code is non-zero if any seed failed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from streamrl.config import Config, RunConfig, load_config, parse_override

DEFAULT_OUTPUT_DIR = RunConfig.model_fields["output_dir"].default  # "runs"
DEFAULT_NAME = RunConfig.model_fields["name"].default  # "default": the main job's


@dataclass
class SeedResult:
    seed: int
    run_dir: Path | None = None
    error: str | None = None  # None: the seed finished


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def plan_sweep(
    config: str | None, overrides: list[str], seeds: list[int]
) -> tuple[Config, str, str]:
    """Validate the config once and pick the shared base name and output directory."""
    cfg = load_config(config, overrides)  # a bad config fails here, before any seed runs
    stem = Path(config).stem if config else "sweep"
    # a sweep's runs are named after the recipe unless it names them itself
    name = cfg.run.name if cfg.run.name and cfg.run.name != DEFAULT_NAME else stem
    output_dir = cfg.run.output_dir
    if not any(parse_override(o)[0] == ["run", "output_dir"] for o in overrides) and (
        output_dir == DEFAULT_OUTPUT_DIR
    ):
        output_dir = str(Path(DEFAULT_OUTPUT_DIR) / stem)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has duplicates: {seeds}")
    return cfg, name, output_dir


def seed_overrides(overrides: list[str], seed: int, name: str, output_dir: str) -> list[str]:
    return [
        *overrides,
        f"seed={seed}",
        f"run.name={name}-s{seed}",
        f"run.output_dir={output_dir}",
        "run.progress=false",
    ]


def _run_in_process(config: str | None, overrides: list[str], seed: int) -> SeedResult:
    from streamrl.run.launch import train
    from streamrl.run.progress import Progress

    os.environ["STREAMRL_ARGV"] = shlex.join(["streamrl", "train", *([config] if config else [])])
    os.environ["STREAMRL_ARGV"] += " " + shlex.join(overrides)
    try:
        with Progress(False) as progress:  # plain '[rl] step i/n' lines
            result = train(load_config(config, overrides), progress=progress)
    except Exception as e:
        traceback.print_exc()
        return SeedResult(seed, error=f"{type(e).__name__}: {e}")
    return SeedResult(seed, run_dir=result.run_dir)


def _run_subprocess(
    config: str | None, overrides: list[str], seed: int, threads: int, lock: threading.Lock
) -> SeedResult:
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli.main",
        "train",
        *([config] if config else []),
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    tail: deque[str] = deque(maxlen=20)
    run_dir = None
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # forwarded with a prefix, so parallel seeds stay readable
            line = line.rstrip("\n")
            tail.append(line)
            if line.startswith("run directory: "):
                run_dir = Path(line.removeprefix("run directory: "))
            with lock:
                print(f"[seed {seed}] {line}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        last = next((t for t in reversed(tail) if t.strip()), "")
        return SeedResult(seed, error=f"exit code {proc.returncode}: {last}")
    return SeedResult(seed, run_dir=run_dir)


def run_sweep(
    config: str | None, seeds: list[int], overrides: list[str] | None = None, parallel: int = 1
) -> int:
    """Run every seed; print the run directories and the `streamrl compare` command."""
    overrides = list(overrides or [])
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    cfg, name, output_dir = plan_sweep(config, overrides, seeds)
    per_seed = {s: seed_overrides(overrides, s, name, output_dir) for s in seeds}
    print(f"sweep: {len(seeds)} seeds of {config or 'the defaults'} -> {output_dir}/{name}-s*")

    if parallel == 1:
        results = []
        for s in seeds:
            print(f"[seed {s}] starting", file=sys.stderr, flush=True)
            results.append(_run_in_process(config, per_seed[s], s))
    else:
        cores = available_cores()
        threads = max(1, cores // parallel)
        if cfg.runtime.threads and cfg.runtime.threads > threads:
            print(
                f"sweep: runtime.threads={cfg.runtime.threads} x --parallel {parallel} exceeds "
                f"{cores} cores; using runtime.threads={threads}",
                file=sys.stderr,
            )
        elif cfg.runtime.threads:
            threads = cfg.runtime.threads
        if parallel * threads > cores:
            print(f"sweep: --parallel {parallel} exceeds {cores} cores", file=sys.stderr)
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = [
                pool.submit(
                    _run_subprocess,
                    config,
                    [*per_seed[s], f"runtime.threads={threads}"],
                    s,
                    threads,
                    lock,
                )
                for s in seeds
            ]
            results = [f.result() for f in futures]

    ok = [r for r in results if r.error is None and r.run_dir is not None]
    failed = [r for r in results if r not in ok]
    print()
    for r in results:
        status = str(r.run_dir) if r in ok else f"FAILED ({r.error or 'no run directory'})"
        print(f"seed {r.seed}: {status}")
    if ok:
        dirs = shlex.join(str(r.run_dir) for r in ok)
        print(f"\ncompare with:\n  streamrl compare {dirs} --metric eval_accuracy_after")
    if failed:
        print(
            f"\n{len(failed)} of {len(results)} seeds failed: {[r.seed for r in failed]}",
            file=sys.stderr,
        )
        return 1
    return 0

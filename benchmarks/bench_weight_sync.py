"""Weight sync: how long publishing new weights to every rollout worker takes.

For each model x backend x worker count, a RolloutPool is started with admission
off (``pool.admit(False)`` before ``start()``: no items are dispatched, so the
workers stay idle and only weight traffic is measured). After every worker has
loaded version 0, the trainer publishes ``--repeats`` fresh state dicts
(versions 1..K, each a new perturbed copy made outside the timed region) and
waits after each one until every worker runs it. Two numbers per publish, both
recorded by the pool itself:

  publish  ``pool.publish_s``: the trainer's time inside ``pool.publish``
  sync     ``pool.sync_latency``: publish start until every live worker has
           reported the new version (loaded into its engine)

Both are reported as median and p90 over the repeats, with the size of the
published state dict (every key, as copied; tied embeddings count twice).

Example:
  PYTHONPATH=. .venv/bin/python benchmarks/bench_weight_sync.py \\
      --models tiny smollm2 --backends local process ray --workers 1 2 --repeats 10
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from streamrl.config import load_config
from streamrl.models import load_model_and_tokenizer
from streamrl.run.assembly import rollout_spec
from streamrl.sources import build_task_source
from streamrl.stream.backends import RolloutPool, make_backend, plan_placement
from streamrl.stream.sample_stream import SampleStream

MODELS = {"tiny": "tiny", "smollm2": "smollm2-135m-instruct"}
WHY = (
    "**Why.** `local` hands the state dict to each engine by reference, but an idle engine "
    "applies it at once on the caller's thread, so its publish is one `load_state_dict` copy "
    "per worker, in series. `process` costs the trainer one copy into shared memory whatever "
    "the worker count; its extra sync latency is each worker copying the buffer out into a "
    "private snapshot and then into its model (two more full copies per worker, sharing the "
    "cores and memory bandwidth with the trainer), plus ~2 ms polling loops on each side, "
    "which is all the tiny model sees. `ray` puts the weights in the object store once per "
    "version (numpy views, serialised by the trainer: one copy) and each actor maps that "
    "object read-only and loads it into its model (one copy per worker); `publish` also waits "
    "for every actor's `update_weights`, so publish ~ sync, and the tiny model's cost is "
    "Ray's per-call overhead (task submission, polling round trips), not bytes."
)


@dataclass
class Result:
    model: str
    mb: float
    backend: str
    workers: int
    startup_s: float
    publish_s: list[float]
    sync_s: list[float]


def p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def fresh_weights(model: torch.nn.Module, version: int) -> dict[str, torch.Tensor]:
    """A new copy of the weights, perturbed so every version is distinct."""
    eps = 1e-6 * version
    return {
        k: v.detach() + eps if v.is_floating_point() else v.detach().clone()
        for k, v in model.state_dict().items()
    }


def size_mb(sd: dict[str, torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in sd.values()) / 1e6


def wait_latency(pool: RolloutPool, version: int, timeout: float = 10.0) -> float:
    """The pool records sync latency just after it updates ``versions``."""
    deadline = time.monotonic() + timeout
    while version not in pool.sync_latency:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no sync latency for version {version}")
        time.sleep(0.0005)
    return pool.sync_latency[version]


def bench(model: torch.nn.Module, tokenizer, name: str, backend: str, workers: int, k: int):
    overrides = [f"model.name_or_path={MODELS[name]}", f"runtime.backend={backend}"]
    cfg = load_config(None, [*overrides, f"runtime.num_rollout_workers={workers}"])
    if backend == "ray":
        from streamrl.stream.backends.ray_actors import init_ray

        init_ray(None)
    weights = fresh_weights(model, 0)
    engine_model = copy.deepcopy(model).eval()  # the controller's engine copy
    t0 = time.perf_counter()
    placement = plan_placement(cfg.runtime)
    spec = rollout_spec(cfg)
    be = make_backend(cfg.runtime, spec, placement, engine_model, tokenizer, weights, "cpu")
    stream = SampleStream(items_per_batch=4, max_staleness=1)
    items = build_task_source("arithmetic", digits=2, operators="+").train_iter(0)
    pool = RolloutPool(be, stream, items, worker_timeout_s=cfg.runtime.worker_timeout_s)
    pool.admit(False)  # _dispatch admits nothing: workers stay idle
    pool.start()
    try:
        pool.wait_version(0, timeout=300)
        startup = time.perf_counter() - t0
        sync = []
        for v in range(1, k + 1):
            sd = fresh_weights(model, v)
            pool.publish(sd, v)
            pool.wait_version(v, timeout=120)
            sync.append(wait_latency(pool, v))
        pool.raise_if_failed()
        assert not any(pool.inflight), "held pool dispatched items"
    finally:
        pool.stop()
        stream.close()
    publish = [pool.publish_s[v] for v in range(1, k + 1)]
    return Result(name, size_mb(weights), backend, workers, startup, publish, sync)


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} / {p90(xs) * 1e3:.1f}"


def git_state() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--short", "--untracked-files=no", "streamrl").replace("\n", ", ")
    return git("rev-parse", "--short", "HEAD") + (f" + uncommitted: {dirty}" if dirty else "")


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return names[0] if names else platform.machine()


def bandwidth(results: list[Result]) -> str:
    """Effective GB/s of one publish (MB / publish median) for the largest model, 1 worker."""
    big = max(r.mb for r in results)
    rows = [r for r in results if r.mb == big and r.workers == min(r.workers for r in results)]
    parts = [f"{r.backend} {r.mb / statistics.median(r.publish_s) / 1e3:.2f} GB/s" for r in rows]
    return f"Publish bandwidth for {rows[0].model} ({rows[0].workers} worker): " + ", ".join(parts)


def render(results: list[Result], args: argparse.Namespace, wall: float) -> str:
    cmd = "PYTHONPATH=. .venv/bin/python " + " ".join(sys.argv)
    lines = [
        "# Weight sync latency per backend",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {os.cpu_count()} cores, CPU only ({cpu_name()}), torch {torch.__version__}, "
        f"float32, trainer torch threads 1  ",
        f"Date: {datetime.date.today().isoformat()}; {args.repeats} publishes per row; "
        f"benchmark wall time {wall:.0f} s  ",
        f"Code: git {git_state()}",
        "",
        "Workers are idle (admission held), so this is pure weight traffic. `publish` is "
        "the trainer's time inside `pool.publish`; `sync` runs from publish start until "
        "every worker reported the new version. Startup: backend start until every worker "
        "had version 0.",
        "",
        "| model | MB | backend | workers | publish median/p90 (ms) "
        "| sync latency median/p90 (ms) | startup (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.model} | {r.mb:.1f} | {r.backend} | {r.workers} | {ms(r.publish_s)} "
            f"| {ms(r.sync_s)} | {r.startup_s:.1f} |"
        )
    return "\n".join([*lines, "", WHY, "", bandwidth(results) + "."]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=list(MODELS))
    backends = ["local", "process", "ray"]
    ap.add_argument("--backends", nargs="+", default=backends, choices=backends)
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/weight_sync.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results: list[Result] = []
    try:
        for name in args.models:
            model, tokenizer = load_model_and_tokenizer(MODELS[name], seed=0)
            for backend in args.backends:
                for n in args.workers:
                    r = bench(model, tokenizer, name, backend, n, args.repeats)
                    print(
                        f"{name} {backend} x{n}: publish {ms(r.publish_s)} ms, "
                        f"sync {ms(r.sync_s)} ms, startup {r.startup_s:.1f} s",
                        flush=True,
                    )
                    results.append(r)
    finally:
        if "ray" in args.backends:
            import ray

            ray.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, args, time.perf_counter() - t0))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

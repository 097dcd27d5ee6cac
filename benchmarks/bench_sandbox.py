"""Sandbox overhead: a sandboxed run of a small program against a bare interpreter.

Each program runs ``--repeats`` times in every variant, interleaved (bare, before,
strong, ...) in one process so that machine noise hits all variants alike:

  bare       ``subprocess.run([sys.executable, "-I", "main.py"])`` of the same file
  before     ``--baseline FILE``: an earlier ``streamrl/sandbox.py`` (e.g. from
             ``git show REV:streamrl/sandbox.py``), its ``Sandbox(mechanism="bwrap")``
  strong     ``Sandbox().run(code)``: bubblewrap namespaces + seccomp + a cgroup per
             run (where the host allows) + rlimits (the default)
  no-cgroup  ``Sandbox(cgroup="off")``: the same without the cgroup (its cost alone)
  weak       ``Sandbox(isolation="weak")``: rlimits and a cgroup, for reference

Latency is the wall time of one call (median and p90), executions/s is the number of
calls divided by their total time (one at a time), and the ratios are the variant's
median over bare's and over before's. A second table runs ``--concurrency`` programs at
once through ``arun`` (bare: ``asyncio.create_subprocess_exec``) and reports executions
per second.

Example:
  git show 3716ccd:streamrl/sandbox.py > /tmp/sandbox_before.py
  PYTHONPATH=. .venv/bin/python benchmarks/bench_sandbox.py --repeats 60 \\
      --baseline /tmp/sandbox_before.py
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamrl.rollout.sandbox import Sandbox, support

PROGRAMS = {
    "trivial": "print(1 + 1)",
    "compute": "print(sum(i * i for i in range(300_000)))",  # ~20 ms of pure Python
}


WHY = (
    "**Why.** The interpreter's own start (~35-45 ms here, `site` included) dominates every "
    "variant. `before` adds bubblewrap's setup (clone into new namespaces, a few dozen "
    "mounts, pivot_root; as root also the uid map we write while bwrap waits) and two small "
    "util-linux execs (`prlimit`, `setpriv`). `strong` adds to that the seccomp filter "
    "(built once per process, copied into a memfd per run, loaded by bwrap) and the "
    "cgroup: a `/bin/sh` exec that joins it, a mkdir and a few limit writes per "
    "hierarchy (five on a cgroup v1 host: memory, pids, cpu, freezer, cpuacct), and their "
    "removal after the run; `no-cgroup` shows the seccomp part alone. With programs in "
    "flight at once the setup work competes for the same two cores."
)


def load_baseline(path: str) -> Any:
    """An earlier sandbox module, loaded from its file under a name of its own."""
    spec = importlib.util.spec_from_file_location("sandbox_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = module
    spec.loader.exec_module(module)
    return module


def boxes(baseline: Any) -> dict[str, Any]:
    """The sandboxed variants, by name."""
    out = {}
    if baseline is not None:
        out["before"] = baseline.Sandbox(mechanism="bwrap")
    out |= {
        "strong": Sandbox(),
        "no-cgroup": Sandbox(cgroup="off"),
        "weak": Sandbox(isolation="weak"),
    }
    return out


def p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def bare_runner(code: str, workdir: Path) -> Callable[[], None]:
    path = workdir / "main.py"
    path.write_text(code)

    def run() -> None:
        out = subprocess.run([sys.executable, "-I", "main.py"], cwd=workdir, capture_output=True)
        assert out.returncode == 0, out.stderr

    return run


def sandbox_runner(code: str, box: Any) -> Callable[[], None]:
    def run() -> None:
        result = box.run(code)
        assert result.status == "ok", result

    return run


def sequential(programs: dict[str, str], repeats: int, workdir: Path, baseline: Any) -> list[tuple]:
    """(program, variant, latencies) rows, variants interleaved run by run."""
    sandboxes = boxes(baseline)
    assert sandboxes["strong"].run("pass").isolation == "strong", "no strong sandbox here"
    rows = []
    for name, code in programs.items():
        runners = {"bare": bare_runner(code, workdir)}
        runners |= {v: sandbox_runner(code, box) for v, box in sandboxes.items()}
        for run in runners.values():  # warm the page cache and the filter
            run()
        times: dict[str, list[float]] = {v: [] for v in runners}
        for _ in range(repeats):
            for variant, run in runners.items():
                t0 = time.perf_counter()
                run()
                times[variant].append(time.perf_counter() - t0)
        rows += [(name, variant, ts) for variant, ts in times.items()]
    return rows


async def concurrent(
    code: str, n: int, concurrency: int, workdir: Path, baseline: Any
) -> dict[str, float]:
    """Executions per second with ``concurrency`` programs in flight, per variant."""
    (workdir / "main.py").write_text(code)
    limit = asyncio.Semaphore(concurrency)

    async def bare() -> None:
        async with limit:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "main.py", cwd=workdir, stdout=-1, stderr=-1
            )
            await proc.communicate()

    async def sandboxed(box: Any) -> None:
        async with limit:
            assert (await box.arun(code)).status == "ok"

    variants: dict[str, Callable[[], Any]] = {"bare": bare}
    for variant, box in boxes(baseline).items():
        variants[variant] = lambda box=box: sandboxed(box)
    elapsed = dict.fromkeys(variants, 0.0)
    rounds = 10  # variants take turns, batch by batch, so that noise hits all alike
    for _ in range(rounds):
        for variant, make in variants.items():
            t0 = time.perf_counter()
            await asyncio.gather(*(make() for _ in range(n // rounds)))
            elapsed[variant] += time.perf_counter() - t0
    rates = {v: rounds * (n // rounds) / t for v, t in elapsed.items()}
    return rates


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def render(
    rows: list[tuple], rates: dict[str, float], args: argparse.Namespace, load: list[float]
) -> str:
    medians = {(name, variant): statistics.median(ts) for name, variant, ts in rows}
    baseline = " --baseline /tmp/sandbox_before.py" if args.baseline else ""
    lines = [
        "# Sandbox overhead",
        "",
        f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/bench_sandbox.py "
        f"--repeats {args.repeats} --concurrency {args.concurrency}{baseline}`"
        + (f" (baseline: `git show {args.baseline_rev}:streamrl/sandbox.py`)" if baseline else "")
        + "  ",
        f"Machine: {os.cpu_count()} cores ({cpu_name()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, run as {'root' if os.geteuid() == 0 else 'a user'}, "
        f"cgroups: {support().note}  ",
        f"Date: {datetime.date.today()}; {args.repeats} runs per row, variants interleaved  ",
        f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}. The machine is "
        "shared: other jobs may have been running, so compare the variants of one run (they "
        "took turns), not runs with each other.",
        "",
        "`bare` is `subprocess.run([sys.executable, '-I', 'main.py'])`; `before` the "
        "baseline's strong sandbox (bubblewrap: new namespaces, read-only filesystem, "
        "private tmpfs, uid drop and rlimits via util-linux `prlimit`/`setpriv`); `strong` "
        "is `Sandbox().run(code)`, that plus the seccomp filter and a cgroup per run; "
        "`no-cgroup` the same with `cgroup='off'`; `weak` is `isolation='weak'` (rlimits "
        "and a cgroup). Latency is one call's wall time; executions/s is calls divided by "
        "their total time, one at a time; ratios = median / bare's (before's) median.",
        "",
        "| program | variant | median (ms) | p90 (ms) | executions/s | ratio to bare "
        "| ratio to before |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, variant, ts in rows:
        med = medians[name, variant]
        before = medians.get((name, "before"))
        lines.append(
            f"| {name} | {variant} | {med * 1e3:.1f} | {p90(ts) * 1e3:.1f} | "
            f"{len(ts) / sum(ts):.1f} | {med / medians[name, 'bare']:.2f}x | "
            + (f"{med / before:.2f}x |" if before else "- |")
        )
    lines += [
        "",
        f"`trivial` with {args.concurrency} programs in flight (`arun` / asyncio subprocess), "
        f"{args.concurrent_runs} runs per variant in 10 interleaved batches:",
        "",
        "| variant | executions/s | ratio to bare | ratio to before |",
        "|---|---|---|---|",
        *(
            f"| {v} | {r:.1f} | {r / rates['bare']:.2f}x | "
            + (f"{r / rates['before']:.2f}x |" if "before" in rates else "- |")
            for v, r in rates.items()
        ),
        "",
        WHY,
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--concurrent-runs", type=int, default=160)
    ap.add_argument("--out", default="benchmarks/results/sandbox.md")
    ap.add_argument("--baseline", help="an earlier streamrl/sandbox.py, run as 'before'")
    ap.add_argument("--baseline-rev", default="3716ccd", help="its revision, for the report")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the weak variant's warning is expected
    baseline = load_baseline(args.baseline) if args.baseline else None
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        rows = sequential(PROGRAMS, args.repeats, Path(tmp), baseline)
        rates = asyncio.run(
            concurrent(
                PROGRAMS["trivial"], args.concurrent_runs, args.concurrency, Path(tmp), baseline
            )
        )
    load.append(os.getloadavg()[0])
    text = render(rows, rates, args, load)
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

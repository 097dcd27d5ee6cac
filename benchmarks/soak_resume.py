"""Soak test of resume: one run, SIGKILLed at random moments, resumed after each kill.

    PYTHONPATH=. python benchmarks/soak_resume.py --kills 20 --eta 0 --eta 1

For each eta it trains an uninterrupted reference run, then the same config again,
killing the whole process tree (SIGKILL to its process group) at a random moment
``--kills`` times and resuming with ``streamrl train --resume RUN_DIR`` after each
kill. It then reads the run's ledger (how every issued item ended) and reports
items lost (issued, never ended) and duplicated (consumed more than once), which
must both be 0, and whether the final weights equal the reference run's (they must
at eta = 0). Results go to benchmarks/results/soak_resume.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runs" / "soak"


def config(name: str, eta: int, backend: str) -> list[str]:
    # the default settings, dynamic sampling included: at eta = 0 its refills join the
    # engine's steps at moments that depend on timing, and the batch-invariant engine
    # (rollout.batch_invariant, on at eta = 0) keeps the weights bit-exact anyway
    return [
        "model.name_or_path=tiny",
        "sft.steps=200",
        "train.steps=150",  # long enough for 20 kills 4-14 s apart
        "train.items_per_step=8",
        "rollout.group_size=8",
        f"stream.max_staleness={eta}",
        f"runtime.backend={backend}",
        "eval.heldout_size=100",
        "eval.every=0",
        "run.checkpoint_every=5",
        "run.tensorboard=false",
        "run.progress=false",
        f"run.output_dir={OUT}",
        f"run.name={name}",
    ]


def streamrl(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def books(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    consumed = Counter(i for r in rows for i in r["consumed"])
    ended = Counter(consumed)
    for outcome in ("filtered", "failed"):
        ended.update(i for r in rows for ids in r.get(outcome, {}).values() for i in ids)
    issued = summary["stream/issued"]
    return {
        "issued": issued,
        "consumed": sum(consumed.values()),
        "lost": sum(1 for i in range(issued) if i not in ended),
        "duplicated": sum(n - 1 for n in ended.values() if n > 1),
        "status": summary["status"],
        "resumed_items": summary.get("resumed_items", 0),
    }


def soak(eta: int, kills: int, backend: str, rng: random.Random) -> dict:
    ref = OUT / f"ref-eta{eta}"
    if not (ref / "summary.json").exists():
        subprocess.run(
            [sys.executable, "-m", "streamrl.cli.main", "train", *config(ref.name, eta, backend)],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    run_dir = OUT / f"soak-eta{eta}"
    args = config(run_dir.name, eta, backend)
    landed, t0 = [], time.time()
    for k in range(kills):
        proc = streamrl(args if k == 0 else ["--resume", str(run_dir)])
        time.sleep(rng.uniform(4.0, 14.0))  # a random moment: start-up, SFT, RL, a checkpoint
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before kill {k + 1}: {proc.stderr.read()[-2000:]}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pointer = run_dir / "checkpoints" / "latest"
        latest = pointer.read_text() if pointer.exists() else "none"
        landed.append(latest)
        print(f"  eta={eta} kill {k + 1}/{kills}: latest checkpoint {latest}", flush=True)
    final = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", "train", "--resume", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if final.returncode:
        raise SystemExit(final.stderr[-2000:])
    a = load_file(str(ref / "model" / "model.safetensors"))
    b = load_file(str(run_dir / "model" / "model.safetensors"))
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return {
        "eta": eta,
        "kills": kills,
        "checkpoints_at_kills": landed,
        "identical_weights": same,
        "wall_s": time.time() - t0,
        **books(run_dir),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--eta", type=int, action="append", default=None)
    p.add_argument("--backend", default="local")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    results = [soak(eta, args.kills, args.backend, rng) for eta in args.eta or [0, 1]]
    lines = [
        "| eta | SIGKILLs + resumes | items issued | consumed | lost | duplicated "
        "| re-issued at the last resume | final weights = uninterrupted run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['eta']} | {r['kills']} | {r['issued']} | {r['consumed']} | {r['lost']} | "
            f"{r['duplicated']} | {r['resumed_items']} | "
            f"{'yes, bit-identical' if r['identical_weights'] else 'no'} |"
        )
    table = "\n".join(lines)
    print(table)
    out = ROOT / "benchmarks" / "results" / "soak_resume.md"
    out.write_text(
        "# Resume soak test\n\n"
        f"`PYTHONPATH=. python benchmarks/soak_resume.py --kills {args.kills} "
        + " ".join(f"--eta {e}" for e in (args.eta or [0, 1]))
        + f" --backend {args.backend}`\n\n{table}\n\n"
        + "Checkpoint named `latest` at each kill:\n\n"
        + "\n".join(f"- eta={r['eta']}: {', '.join(r['checkpoints_at_kills'])}" for r in results)
        + "\n"
    )
    exact = all(r["identical_weights"] for r in results if r["eta"] == 0)
    if any(r["lost"] or r["duplicated"] for r in results) or not exact:
        sys.exit(1)


if __name__ == "__main__":
    main()

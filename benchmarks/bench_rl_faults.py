"""Page faults and CPU times of each trainer update inside a real `streamrl train` run.

Wraps ``TrainEngine.train_batch`` to read ``getrusage(RUSAGE_THREAD)`` around each
update (the trainer's own thread, not the rollout worker's), writes one JSON line per
update to ``--log``, runs ``streamrl train`` with the remaining arguments, and prints a
summary. Run it once with ``runtime.keep_freed_memory=true`` and once with ``false``:

    PYTHONPATH=. python benchmarks/bench_rl_faults.py --log runs/faults/kept.jsonl -- \\
        train examples/smollm2.yaml rollout.group_size=8 rollout.max_new_tokens=48 \\
        train.steps=8 eval.heldout_size=10 rollout.engine_weights=float16 \\
        runtime.keep_freed_memory=true run.name=kept run.output_dir=runs/faults
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from streamrl.cli import main as cli
from streamrl.engines.train import engine as train_module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", type=Path, required=True, help="one JSON line per update")
    ap.add_argument("--from-update", type=int, default=4, help="first update of the summary")
    ap.add_argument("streamrl_args", nargs=argparse.REMAINDER, help="-- then `streamrl` args")
    args = ap.parse_args()
    argv = args.streamrl_args[1:] if args.streamrl_args[:1] == ["--"] else args.streamrl_args
    args.log.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    train_batch = train_module.TrainEngine.train_batch

    def timed(self, *a, **k):
        r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        metrics = train_batch(self, *a, **k)
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        rows.append(
            {
                "wall": time.perf_counter() - t0,
                "tokens": metrics.get("tokens", 0.0),
                "faults": r1.ru_minflt - r0.ru_minflt,
                "user": r1.ru_utime - r0.ru_utime,
                "sys": r1.ru_stime - r0.ru_stime,
            }
        )
        return metrics

    train_module.TrainEngine.train_batch = timed
    try:
        cli.main(argv)
    finally:
        args.log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if len(rows) < args.from_update:
        return
    first, later = rows[0], rows[args.from_update - 1 :]
    tokens = sum(r["tokens"] for r in later) or 1.0
    print(
        f"first update: {first['wall']:.1f} s wall, {first['sys']:.1f} s kernel, "
        f"{first['faults']:,} faults\nfrom update {args.from_update} ({len(later)} updates): "
        f"{1000 * sum(r['wall'] for r in later) / tokens:.1f} ms per consumed token, "
        f"{sum(r['sys'] for r in later) / len(later):.2f} s kernel and "
        f"{sum(r['faults'] for r in later) / len(later):,.0f} faults per update"
    )


if __name__ == "__main__":
    main()

"""The sharded trainer against the number of ranks N (1, 2; gloo on CPU, one thread a
rank): per-rank training-state bytes (parameters + gradients + AdamW state) and peak RSS,
seconds per GRPO update (samples/s), and the latency of publishing the full weights
(``state_dict_for_inference``: gathered tensor by tensor on rank 0), for the tiny
preset and SmolLM2-135M, side by side in one session. The unsharded TrainEngine (its
default packed forward) on 1 and 2 threads runs in the same session as the baseline.

    PYTHONPATH=. python benchmarks/bench_sharded.py --models tiny smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks.bench_train_step import make_batch
from streamrl.algorithms import make_rl_loss_fn
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.memory import peak_rss_bytes, training_state_bytes
from streamrl.engines.train.sharded import RankZero, ShardedTrainEngine, follow
from streamrl.models import load_model_and_tokenizer
from tests.sharded_harness import run_ranks

MB = 2**20


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _bare_all_gather(rank: int, numel: int, repeats: int) -> list[float]:
    """Seconds of one gloo all-gather of ``numel`` fp32 values (a 1/N flat buffer a rank):
    the floor of what one pass's gathers of the whole model cost, without FSDP. In
    processes of its own (after FSDP's collectives in the same process it aborted)."""
    world = dist.get_world_size()
    shard = torch.zeros(-(-numel // world))
    parts = [torch.empty_like(shard) for _ in range(world)]
    return _timed(lambda: dist.all_gather(parts, shard), repeats)


def _ranks(
    rank: int, name: str, sequences: int, completion: int, repeats: int, micro: int, kept: bool
):
    model, tokenizer = load_model_and_tokenizer(name)
    batch = make_batch(tokenizer, sequences, completion)
    engine = ShardedTrainEngine(
        model,
        lr=5e-6,
        micro_batch_sequences=micro,
        reshard_after_forward=not kept,
        accumulate_unsharded=kept,
    )
    del model
    if rank:
        follow(engine)
        return None
    trainer, loss_fn = RankZero(engine), make_rl_loss_fn("ppo_clip")
    metrics = trainer.train_batch(batch, loss_fn)  # warm-up
    update = _timed(lambda: trainer.train_batch(batch, loss_fn), repeats)
    publish = _timed(trainer.state_dict_for_inference, repeats)
    metrics = trainer.memory_metrics()
    trainer.stop()
    numel = sum(p.numel() for p in engine.model.parameters())
    return {"update": update, "publish": publish, "memory": metrics, "numel": numel}


def _plain(name: str, sequences: int, completion: int, repeats: int, micro: int, threads: int):
    torch.set_num_threads(threads)
    model, tokenizer = load_model_and_tokenizer(name)
    batch = make_batch(tokenizer, sequences, completion)
    engine = TrainEngine(copy.deepcopy(model), lr=5e-6, micro_batch_sequences=micro)
    loss_fn = make_rl_loss_fn("ppo_clip")
    engine.train_batch(batch, loss_fn)
    update = _timed(lambda: engine.train_batch(batch, loss_fn), repeats)
    publish = _timed(engine.state_dict_for_inference, repeats)
    mem = training_state_bytes(engine)
    torch.set_num_threads(1)
    return update, publish, mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m-instruct"])
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--completion", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--keep-gathered",
        action="store_true",
        help="also N=2 with the parameters kept gathered from a minibatch's first forward "
        "to its last backward (reshard_after_forward=False, accumulate_unsharded)",
    )
    ap.add_argument("--micro-batch", type=int, default=8, help="micro_batch_sequences")
    ap.add_argument(
        "--ratio-rounds",
        type=int,
        default=0,
        help="instead of the table: this many alternating rounds of N=2 x 1 thread (with "
        "--keep-gathered: kept gathered) and the unsharded trainer on 2 threads, each "
        "round's samples/s ratio",
    )
    args = ap.parse_args()
    if args.ratio_rounds:
        _ratio_rounds(args)
        return
    rows = []
    for name in args.models:
        shape = (args.sequences, args.completion, args.repeats, args.micro_batch)
        variants = [(1, False), (2, False)] + [(2, True)] * args.keep_gathered
        results = {v: run_ranks(_ranks, v[0], name, *shape, v[1])[0] for v in variants}
        gather = run_ranks(_bare_all_gather, 2, results[1, False]["numel"], args.repeats)[0]
        plain = {t: _plain(name, *shape, threads=t) for t in (1, 2)}
        base = sum(
            results[1, False]["memory"][f"rank0/{k}"]
            for k in ("param_bytes", "grad_bytes", "optim_bytes")
        )
        for (n, kept), res in results.items():
            label = f"sharded N={n}" + (", kept gathered through the minibatch" if kept else "")
            mem = res["memory"]
            for r in range(n):
                state = sum(
                    mem[f"rank{r}/{k}"] for k in ("param_bytes", "grad_bytes", "optim_bytes")
                )
                rows.append(
                    f"| {name} | {label}, rank {r} | {state / MB:.1f} | {state / base:.3f} | "
                    f"{mem[f'rank{r}/peak_rss_bytes'] / MB:.0f} | "
                    + (
                        f"{args.sequences / statistics.median(res['update']):.2f} | "
                        f"{statistics.median(res['publish']) * 1e3:.0f} | "
                        + (f"{statistics.median(gather) * 1e3:.0f} |" if n == 2 else "|")
                        if r == 0
                        else "| | |"
                    )
                )
        for threads, (update, publish, mem) in plain.items():
            state = mem["param_bytes"] + mem["grad_bytes"] + mem["optim_bytes"]
            rows.append(
                f"| {name} | unsharded TrainEngine, {threads} threads | {state / MB:.1f} | "
                f"{state / base:.3f} | {peak_rss_bytes() / MB:.0f} (bench process) | "
                f"{args.sequences / statistics.median(update):.2f} | "
                f"{statistics.median(publish) * 1e3:.0f} | |"
            )
    print(
        f"\n{args.sequences} sequences, completions up to {args.completion} tokens, "
        f"median of {args.repeats}\n"
        "| model | trainer | train state MB (rank) | vs sharded N=1 | peak RSS MB | "
        "samples/s | publish ms | bare all-gather ms |\n|---|---|---|---|---|---|---|---|"
    )
    print("\n".join(rows))


def _ratio_rounds(args: argparse.Namespace) -> None:
    """Alternate the two trainers ``--ratio-rounds`` times (drift in the machine's speed
    reaches both alike) and print each round's ratio and their mean and range."""
    for name in args.models:
        shape = (args.sequences, args.completion, args.repeats, args.micro_batch)
        ratios = []
        for i in range(args.ratio_rounds):
            sharded = run_ranks(_ranks, 2, name, *shape, args.keep_gathered)[0]["update"]
            plain = _plain(name, *shape, threads=2)[0]
            ratios.append(statistics.median(plain) / statistics.median(sharded))
            print(
                f"{name} round {i + 1}: N=2 x 1 thread {args.sequences / statistics.median(sharded):.2f}"
                f" samples/s, unsharded 2 threads {args.sequences / statistics.median(plain):.2f}:"
                f" {ratios[-1]:.3f}x",
                flush=True,
            )
        print(
            f"{name}, {args.sequences} sequences, kept gathered={args.keep_gathered}: "
            f"median {statistics.median(ratios):.3f}x, mean {statistics.mean(ratios):.3f}x, "
            f"range {min(ratios):.3f}-{max(ratios):.3f}x over {len(ratios)} rounds"
        )


if __name__ == "__main__":
    main()

"""How many generated-then-filtered groups can prompt selection avoid at all?

Dynamic sampling drops a group when all its ``G`` samples are equal (all right or all
wrong). Prompt selection (``selection.*``) tries to skip such prompts before they are
generated. This script measures the best any per-prompt predictor could do, for a policy
checkpoint, on fresh draws of the task:

1. For each of ``--items`` training items it draws ``--samples`` completions (the run's
   own sampling parameters, ``rollout.*``) and scores them with the run's correctness
   reward.
2. Samples ``[0, S/2)`` are the *history*: what a per-prompt Beta-Bernoulli posterior
   would know after S/2 earlier samples of this prompt at the current policy (far more
   than the main job ever has: about 80% of its draws are first draws).
3. ``p_hat`` is the policy's own probability of the reference answer (answer + EOS,
   teacher-forced by the engine exactly as ``selection.kind=likelihood`` scores it), a
   predictor that needs no history at all.
4. Samples ``[S/2, S)`` are the *future*: cut into disjoint groups of ``G``, their
   all-equal rate is an unbiased estimate of the drop rate of the items a predictor keeps.

Rules, each scored on the future groups:

- ``history, lowest first`` / ``p_hat, lowest first``: keep the given fraction of items
  with the lowest predicted P(all equal) (history: Beta-Bernoulli's p^G + (1-p)^G; p_hat:
  p_hat^G, the likelihood gate's lower bound on P(all correct)). A ranking needs the whole
  draw at once, so it is a bound, not a streaming rule.
- ``gate: skip p_hat^G > t``: exactly what ``selection.kind=likelihood`` with
  ``selection.threshold=t`` does.
- ``first k equal: stop the group``: generate k samples, stop the group when they agree
  (the stopped group is filtered, k sequences spent), else generate the other G - k.

Columns: the drop rate among issued groups; dropped groups per consumed group relative to
no selection (halving the dropped groups for the same training means 0.5); and sequences
generated per consumed group relative to no selection, counting every scoring request of
``p_hat`` as one sequence (it is one teacher-forced sequence of the reference's length, so
this is about right for a direct-answer task and pessimistic when completions are long).

    PYTHONPATH=. python benchmarks/bench_selection_bound.py --run runs/default \
        --states model checkpoints/rl-000100 checkpoints/rl-000150 --out runs/selection_bound
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrl.config import load_config
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.models.loading import load_model_and_tokenizer
from streamrl.models.tokenizer import encode_prompt
from streamrl.rollout.episodes import sampling_params
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection.gate import LikelihoodGate
from streamrl.sources import build_task_source

KEEP = (1.0, 0.8, 0.5, 0.3, 0.2)
THRESHOLDS = (0.3, 0.5, 0.7, 0.8, 0.9)  # selection.kind=likelihood's selection.threshold


def load_state(run: Path, state: str) -> tuple[torch.nn.Module, Any]:
    """``model`` (the run's final weights) or a checkpoint directory's trainer weights,
    and the run's tokenizer."""
    model, tokenizer = load_model_and_tokenizer(str(run / "model"))
    if state != "model":
        weights = torch.load(run / state / "trainer.pt", map_location="cpu", weights_only=False)
        model.load_state_dict(weights["model"])
    return model.eval(), tokenizer


def reference_probability(engine, tokenizer, items, params: SamplingParams) -> np.ndarray:
    """p_hat per item, scored exactly as selection.kind=likelihood scores it (the gate with
    G = 1 returns p_hat itself); all items are scored in one engine batch."""
    gate = LikelihoodGate(tokenizer, params, group_size=1, threshold=0.5)

    async def score() -> list[float | None]:
        return await asyncio.gather(*(gate.p_all_correct(engine, item) for item in items))

    return np.array([p if p is not None else 0.0 for p in asyncio.run(score())])


def sampled_successes(engine, tokenizer, items, cfg, params, samples: int, seed: int):
    """(items, samples) 0/1 outcomes of the run's correctness reward."""
    reward = build_reward(cfg.reward)
    requests = [
        GenerationRequest(encode_prompt(tokenizer, item), params, seed * 10**6 + i * samples + j)
        for i, item in enumerate(items)
        for j in range(samples)
    ]
    results = engine.generate(requests)
    scores = []
    for k, res in enumerate(results):
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        scored = reward(text, items[k // samples])
        scores.append(float((scored.components[cfg.reward.correct_reward] or 0.0) > 0.5))
    return np.array(scores).reshape(len(items), samples)


def all_equal(p: np.ndarray, g: int) -> np.ndarray:
    return p**g + (1 - p) ** g


def per_consumed(spent: float, drop_rate: float) -> float:
    """Per issued item ``spent``, per consumed (kept) group: inf when nothing is kept."""
    return spent / (1 - drop_rate) if drop_rate < 1 else float("inf")


def dropped_ratio(drop_rate: float, base: float) -> float:
    """Dropped groups per consumed group, relative to no selection (0.5 = halved)."""
    return (
        per_consumed(drop_rate, drop_rate) / per_consumed(base, base)
        if 0 < base < 1
        else float("nan")
    )


def analyse(successes: np.ndarray, p_hat: np.ndarray, g: int) -> dict:
    half = successes.shape[1] // 2
    history, future = successes[:, :half], successes[:, half:]
    groups = future[:, : (future.shape[1] // g) * g].reshape(len(future), -1, g)
    future_all_equal = (groups.min(2) == groups.max(2)).mean(1)  # per item, unbiased
    base = future_all_equal.mean()
    base_cost = per_consumed(g, base)  # sequences generated per consumed group, no selection
    rows = []
    for name, predicted in (
        ("history", all_equal(history.mean(1), g)),
        ("p_hat", p_hat**g),  # P_hat(all correct), the gate's predictor
    ):
        order = np.argsort(predicted, kind="stable")
        for keep in KEEP:
            kept = order[: max(1, int(round(keep * len(order))))]
            d = float(future_all_equal[kept].mean())
            ratio = dropped_ratio(d, base)
            # the history predictor needs no scoring request, p_hat one per drawn item
            cost = per_consumed(g + (1 / keep if name == "p_hat" and keep < 1 else 0), d)
            rows.append(
                {
                    "predictor": f"{name}, lowest first",
                    "keep": keep,
                    "drop_rate": d,
                    "dropped_ratio": ratio,
                    "cost_ratio": cost / base_cost,
                }
            )
    # the rule selection.kind=likelihood runs: skip when p_hat^G > threshold; the cost counts
    # the scoring request (one teacher-forced sequence, as one sequence: an upper bound on a
    # direct-answer task) and the G samples of every issued item, per consumed group
    q_all = p_hat**g  # P_hat(all correct): p_hat is a lower bound on success
    for tau in THRESHOLDS:
        q = (q_all <= tau).astype(float)
        if q.sum() == 0:
            continue
        d = float((q * future_all_equal).sum() / q.sum())
        kept = float(q.mean())
        ratio = dropped_ratio(d, base)
        cost = per_consumed(g + 1 / kept, d)
        rows.append(
            {
                "predictor": f"gate: skip p_hat^G > {tau}",
                "keep": kept,
                "drop_rate": d,
                "dropped_ratio": ratio,
                "sequences_per_consumed": cost,
                "cost_ratio": cost / base_cost,
            }
        )
    # two waves: generate k samples; stop the group when they are all equal (counted as
    # filtered, k sequences spent), otherwise generate the other G - k
    for k in (2, 3, 4):
        first = groups[:, :, :k]
        stopped = first.min(2) == first.max(2)
        informative = (groups.min(2) != groups.max(2)) & ~stopped
        d = float(1 - informative.mean())
        spent = float(np.where(stopped, k, g).mean())
        ratio = dropped_ratio(d, base)
        rows.append(
            {
                "predictor": f"first {k} equal: stop the group",
                "keep": float(1 - stopped.mean()),
                "drop_rate": d,
                "dropped_ratio": ratio,
                "cost_ratio": per_consumed(spent, d) / base_cost,
            }
        )
    p_future = future.mean(1)
    return {
        "sampled_accuracy": float(successes.mean()),
        "p_hat_mean": float(p_hat.mean()),
        "corr_p_hat_future": float(np.corrcoef(p_hat, p_future)[0, 1]),
        "corr_history_future": float(np.corrcoef(history.mean(1), p_future)[0, 1]),
        "success_rate_quantiles": {
            str(q): float(v)
            for q, v in zip(
                (0.1, 0.25, 0.5, 0.75, 0.9),
                np.quantile(p_future, (0.1, 0.25, 0.5, 0.75, 0.9)),
                strict=True,
            )
        },
        "drop_rate_no_selection": float(base),
        "sequences_per_consumed_no_selection": base_cost,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=Path("runs/default"))
    ap.add_argument("--states", nargs="+", default=["model"])
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.run / "config.yaml")
    g = cfg.rollout.group_size
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    draws = source.train_iter(args.seed)
    items = [next(draws) for _ in range(args.items)]
    report = {"run": str(args.run), "group_size": g, "items": args.items, "samples": args.samples}
    for state in args.states:
        t0 = time.perf_counter()
        model, tokenizer = load_state(args.run, state)
        engine, params = LocalEngine(model, tokenizer), sampling_params(cfg.rollout, tokenizer)
        p_hat = reference_probability(engine, tokenizer, items, params)
        successes = sampled_successes(
            engine, tokenizer, items, cfg, params, args.samples, args.seed
        )
        engine.close()
        result = analyse(successes, p_hat, g)
        report[state] = result
        print(
            f"\n## {state}: sampled accuracy {result['sampled_accuracy']:.3f}, drop rate with "
            f"no selection {result['drop_rate_no_selection']:.3f}, corr(p_hat, future) "
            f"{result['corr_p_hat_future']:.2f}, corr(history, future) "
            f"{result['corr_history_future']:.2f} ({time.perf_counter() - t0:.0f} s)"
        )
        print(
            "| predictor (rule) | kept | drop rate among issued | dropped per consumed, vs none "
            "| sequences per consumed group, vs none |"
        )
        print("|---|---|---|---|---|")
        for r in result["rows"]:
            cost = f"{r['cost_ratio']:.2f}" if "cost_ratio" in r else ""
            print(
                f"| {r['predictor']} | {r['keep']:.0%} | {r['drop_rate']:.3f} "
                f"| {r['dropped_ratio']:.2f} | {cost} |"
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "selection_bound.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""SmolLM2 RL on the CPU: streamrl against a plain transformers generate-then-train loop,
each given the same wall-clock budget; seconds per RL step and held-out accuracy after.

The workload is the performance issue's: SmolLM2-135M-Instruct, chat-format 2-digit
addition (``examples/smollm2.yaml``), GRPO with 2 prompts x 8 samples a step, at most
48 new tokens, temperature 1, lr 5e-6, 8 sequences per micro-batch.

- **streamrl**: ``streamrl train examples/smollm2.yaml`` with those overrides and
  ``run.max_rl_seconds=BUDGET`` (asynchronous, eta = 1, dynamic sampling, the default
  placement, the example's fp16 engine weights), in a subprocess. Add
  ``--variant fp32:rollout.engine_weights=float32`` for the exact fp32 engine.
- **plain**: what one writes with transformers alone, in a subprocess with both cores:
  ``model.generate`` (8 return sequences per prompt), score, group-normalised advantages,
  a policy-gradient step on the full forward (on-policy, so the PPO ratio is 1), AdamW,
  repeated until the budget is spent.

- **issue** (``--issue-tree DIR``): streamrl as it was when the performance issue was
  filed (commit 3724143, checked out in a git worktree at DIR) on the same workload. That
  code has no wall-clock budget, so it runs ``--issue-steps`` steps; its seconds per step
  are its RL time over its steps. Its final weights are scored by this checkout's
  evaluation, like the plain side's.

All sides count only the RL loop and are scored by the same greedy held-out evaluation
(``streamrl.analysis.evaluate_model`` on ``eval.heldout_size`` items). The sides run one
after the other in one session; run it with nothing else on the machine.

    PYTHONPATH=. python benchmarks/bench_rl_step.py --budget 480 --out runs/bench_rl_step
    git worktree add /tmp/issue13 3724143
    PYTHONPATH=. python benchmarks/bench_rl_step.py --only issue --issue-tree /tmp/issue13
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = [
    "rollout.group_size=8",
    "rollout.max_new_tokens=48",
    "train.items_per_step=2",
    "train.micro_batch_sequences=8",
    "train.steps=100000",  # the budget ends the run
    "eval.samples=0",
]


# The workload in the config keys of the code the issue was filed against (3724143).
ISSUE_WORKLOAD = [
    "rollout.group_size=8",
    "rollout.max_new_tokens=48",
    "train.batch_size=2",
    "train.micro_batch_size=8",
]


def heldout_scorer(heldout: int, seed: int, name_or_path: str | None = None):
    """(cfg, model, tokenizer, reward, source, accuracy): the workload, its model (or the
    one saved at ``name_or_path``) and its greedy held-out accuracy by this checkout's
    evaluation."""
    import torch

    from streamrl.analysis.evaluate import evaluate_model
    from streamrl.config import load_config
    from streamrl.models import load_model
    from streamrl.rollout.episodes import build_episode
    from streamrl.rollout.rewards import build_reward
    from streamrl.run.assembly import episode_spec
    from streamrl.sources import build_task_source

    cfg = load_config("examples/smollm2.yaml", [*WORKLOAD, f"eval.heldout_size={heldout}"])
    torch.manual_seed(seed)
    model, tok = load_model(name_or_path or cfg.model.name_or_path)
    reward = build_reward(cfg.reward)
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    episode = build_episode(episode_spec(cfg), tok, reward, max_new_tokens=cfg.eval.max_new_tokens)
    heldout_items = source.heldout(cfg.eval.heldout_size)

    def accuracy() -> float:
        res = evaluate_model(
            model, tok, episode, heldout_items, cfg.reward.correct_reward, greedy=True, seed=seed
        )
        return float(res.metrics["accuracy"])

    return cfg, model, tok, reward, source, accuracy


def plain_loop(budget: float, heldout: int, seed: int, out: Path) -> dict:
    """The transformers-only baseline; returns its summary."""
    import torch
    from transformers import GenerationConfig

    from streamrl.models import encode_prompt

    torch.set_num_threads(2)
    cfg, model, tok, reward, source, accuracy = heldout_scorer(heldout, seed)
    before = accuracy()
    stop_ids = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")})
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop_ids[0]
    gen = GenerationConfig(
        do_sample=True, temperature=cfg.rollout.temperature, top_k=0, top_p=1.0,
        max_new_tokens=cfg.rollout.max_new_tokens, num_return_sequences=cfg.rollout.group_size,
        eos_token_id=stop_ids, pad_token_id=pad,
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, betas=(0.9, 0.95))
    items = source.train_iter(seed)
    g, p, mbs = cfg.rollout.group_size, cfg.train.items_per_step, cfg.train.micro_batch_sequences
    steps, rewards, t0 = 0, [], time.perf_counter()
    while time.perf_counter() - t0 < budget:
        batch_items = [next(items) for _ in range(p)]
        prompts = [encode_prompt(tok, it) for it in batch_items]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompts])
        att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts])
        model.eval()
        with torch.no_grad():
            seqs = model.generate(input_ids=ids, attention_mask=att, generation_config=gen)
        completion = seqs[:, width:]
        # real completion tokens: up to and including the first stop token
        is_stop = torch.isin(completion, torch.tensor(stop_ids))
        after_stop = (is_stop.cumsum(1) - is_stop.int()) > 0
        loss_mask = ~after_stop
        texts = tok.batch_decode(completion.masked_fill(after_stop, pad), skip_special_tokens=True)
        r = torch.tensor(
            [reward(t, batch_items[i // g]).total or 0.0 for i, t in enumerate(texts)]
        ).view(p, g)
        rewards.append(float(r.mean()))
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
        full_att = torch.cat([att.repeat_interleave(g, 0), loss_mask.long()], 1)
        n_tokens = int(loss_mask.sum())
        model.train()
        opt.zero_grad(set_to_none=True)
        for s in range(0, p * g, mbs):
            rows = slice(s, s + mbs)
            logits = model(input_ids=seqs[rows], attention_mask=full_att[rows]).logits
            logp = logits[:, width - 1 : -1].float().log_softmax(-1)
            logp = logp.gather(-1, completion[rows, :, None]).squeeze(-1)
            loss = -(adv[rows, None] * logp * loss_mask[rows]).sum() / max(n_tokens, 1)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        opt.step()
        steps += 1
        print(f"plain step {steps}: {time.perf_counter() - t0:.1f} s", flush=True)
    rl_time = time.perf_counter() - t0
    summary = {
        "steps": steps,
        "rl_time_s": rl_time,
        "s_per_step": rl_time / steps,
        "eval_accuracy_before": before,
        "eval_accuracy_after": accuracy(),
        "reward_mean_first_last": [rewards[0], rewards[-1]],
    }
    (out / "plain.json").write_text(json.dumps(summary, indent=1))
    return summary


def streamrl_run(
    budget: float, heldout: int, seed: int, out: Path, name: str = "streamrl", extra=()
) -> dict:
    cmd = [
        sys.executable, "-m", "streamrl.cli.main", "train", "examples/smollm2.yaml", *WORKLOAD,
        f"run.max_rl_seconds={budget}", f"eval.heldout_size={heldout}", f"seed={seed}",
        f"run.output_dir={out}", f"run.name={name}", "run.save_weights=false",
        "run.progress=false", *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    return run_summary(out / name)


def run_summary(run_dir: Path) -> dict:
    """Steps, RL time and held-out accuracy from a streamrl run's summary.json."""
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        "steps": s["steps"],
        "rl_time_s": s["rl_time_s"],
        "s_per_step": s["rl_time_s"] / s["steps"],
        "eval_accuracy_before": s["eval_accuracy_before"],
        "eval_accuracy_after": s["eval_accuracy_after"],
    }


def issue_run(tree: Path, steps: int, heldout: int, seed: int, out: Path) -> dict:
    """streamrl at the issue's commit, checked out at ``tree``, for ``steps`` RL steps."""
    name = "issue"
    cmd = [
        sys.executable, "-m", "streamrl.cli.main", "train", "examples/smollm2.yaml", *ISSUE_WORKLOAD,
        f"train.steps={steps}", f"eval.heldout_size={heldout}", f"seed={seed}",
        f"run.output_dir={out.resolve()}", f"run.name={name}", "run.progress=false",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    summary = run_summary(out / name)
    *_, accuracy = heldout_scorer(heldout, seed, str(out / name / "model"))
    summary["eval_accuracy_after_own_evaluation"] = summary["eval_accuracy_after"]
    summary["eval_accuracy_after"] = accuracy()
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=480.0, help="RL wall-clock seconds per side")
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=["plain", "streamrl", "issue"])
    ap.add_argument(
        "--issue-tree",
        type=Path,
        help="a checkout of commit 3724143 (streamrl when the issue was filed): run it too",
    )
    ap.add_argument("--issue-steps", type=int, default=16, help="RL steps of the issue side")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="an extra streamrl run with these overrides, e.g. "
        "'fp16:rollout.engine_weights=float16' (repeatable; runs after the default one)",
    )
    ap.add_argument(
        "--no-default", action="store_true", help="run the variants without the default run"
    )
    ap.add_argument("--out", default="runs/bench_rl_step")
    ap.add_argument("--plain-inline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plain_inline:  # the subprocess of the plain side
        plain_loop(args.budget, args.heldout, args.seed, out)
        return
    results = {}
    if args.only in (None, "streamrl"):
        runs = [] if args.no_default else [("streamrl", "streamrl", [])]
        for v in args.variant:
            name, _, sets = v.partition(":")
            runs.append((f"streamrl {name}", f"streamrl-{name}", sets.split(",")))
        for label, run_name, sets in runs:
            results[label] = streamrl_run(args.budget, args.heldout, args.seed, out, run_name, sets)
    if args.issue_tree is not None and args.only in (None, "issue"):
        results["issue (3724143)"] = issue_run(
            args.issue_tree, args.issue_steps, args.heldout, args.seed, out
        )
    if args.only in (None, "plain"):
        subprocess.run(
            [sys.executable, __file__, "--plain-inline", "--budget", str(args.budget),
             "--heldout", str(args.heldout), "--seed", str(args.seed), "--out", str(out)],
            check=True,
        )  # fmt: skip
        results["plain"] = json.loads((out / "plain.json").read_text())
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nSmolLM2-135M, {args.budget:.0f} s of RL each, {args.heldout} held-out items")
    print("| trainer | RL steps | s per step | held-out accuracy before -> after |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['steps']} | {r['s_per_step']:.1f} | "
            f"{r['eval_accuracy_before']:.2f} -> {r['eval_accuracy_after']:.2f} |"
        )


if __name__ == "__main__":
    main()

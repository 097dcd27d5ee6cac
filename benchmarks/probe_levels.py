"""Which reasoning-gym tasks can SmolLM2-135M-Instruct learn from? A cheap probe before a
curriculum measurement: for each task, at level 0 of its reasoning-gym curriculum and as
configured, the greedy accuracy on ``--items`` held-out items and the share of groups of
``--group`` samples at temperature 1 that come out all wrong (dynamic sampling drops them).

Chat format with the system prompt of ``examples/curriculum.yaml``, ``--tokens`` new
tokens, scored by the task's own ``score_answer`` (as the ``reasoning_gym`` reward does).

    PYTHONPATH=. python benchmarks/probe_levels.py --tasks leg_counting chain_sum \
        --items 32 --groups 16
"""

from __future__ import annotations

import argparse
import dataclasses

import reasoning_gym
import torch
from reasoning_gym.factory import create_curriculum, has_curriculum

from streamrl.models import load_model_and_tokenizer

SYSTEM = "Answer with only the final number."


def entries(task: str, level: int | None, n: int, seed: int) -> list[dict]:
    config: dict = {}
    if level is not None and has_curriculum(task):
        curriculum = create_curriculum(task)
        curriculum.set_global_level(level)
        config = dataclasses.asdict(curriculum.generate_configuration({}))
        config.pop("size", None), config.pop("seed", None)
    return list(reasoning_gym.create_dataset(task, size=n, seed=seed, **config))


@torch.no_grad()
def answers(model, tok, qs: list[str], tokens: int, sample: bool, system: str) -> list[str]:
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in qs]
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        max_new_tokens=tokens,
        do_sample=sample,
        temperature=1.0 if sample else None,
        top_p=None,
        top_k=None,
        pad_token_id=tok.pad_token_id,
    )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def probe(model, tok, task: str, level: int | None, args: argparse.Namespace) -> str:
    score = reasoning_gym.get_score_answer_fn(task)
    held = entries(task, level, args.items, 10_000)
    got = answers(model, tok, [e["question"] for e in held], args.tokens, False, args.system)
    right = [score(a.strip(), e) for e, a in zip(held, got, strict=True)]
    train = entries(task, level, args.groups, 1)
    qs = [e["question"] for e in train for _ in range(args.group)]
    got = answers(model, tok, qs, args.tokens, True, args.system)
    wins = [score(a.strip(), train[i // args.group]) > 0.5 for i, a in enumerate(got)]
    groups = [wins[i : i + args.group] for i in range(0, len(wins), args.group)]
    all_wrong = sum(not any(g) for g in groups) / len(groups)
    sampled = sum(wins) / len(wins)
    where = "as configured" if level is None else f"level {level}"
    example = got[0].strip().replace("\n", " ")[:60]
    return (
        f"| {task} | {where} | {sum(r > 0.5 for r in right) / len(right):.3f} | "
        f"{sampled:.3f} | {all_wrong:.3f} | {example!r} / {train[0]['answer']!r} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["leg_counting", "basic_arithmetic", "chain_sum"])
    ap.add_argument("--items", type=int, default=32, help="held-out items (greedy)")
    ap.add_argument("--groups", type=int, default=16, help="training groups sampled")
    ap.add_argument("--group", type=int, default=4, help="samples per group")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--system", default=SYSTEM)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    print(
        "| task | items | greedy held-out | sampled accuracy | all-wrong groups | example / answer |"
    )
    print("|---|---|---|---|---|---|")
    for task in args.tasks:
        for level in (0, None):
            print(probe(model, tok, task, level, args), flush=True)


if __name__ == "__main__":
    main()

"""The A-LoL stage: advantage-weighted offline policy gradient on logged completions
with rewards (see :mod:`streamrl.algorithms.alol` for the objective).

    rows = load_completions(alol.path)                    # file:line: field errors
    A = reward - V_ref(prompt)                            # reference_value (alol.baseline)
    keep rows with A > 0                                  # A-LoL trains on these only
    batch = examples_per_step rows, drawn in proportion to A (alol.sampling=priority)
    batch.behavior_logprobs = reference's log-probs       # prepare: pi_ref is the data's policy
    trainer.train_batch(batch, RLLoss("alol", clip=[1 - eps, 1 + eps]))   # as GRPO's loss
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch

from streamrl.algorithms.advantages import broadcast_to_tokens
from streamrl.algorithms.alol import reference_value
from streamrl.algorithms.base import pad_id
from streamrl.algorithms.losses import PolicyLossParams, RLLoss
from streamrl.algorithms.stages.base import (
    Encode,
    StageData,
    StageInputs,
    encode_logged,
    reference_logprobs,
    shuffled_epochs,
)
from streamrl.config import ALoLConfig
from streamrl.core.types import Batch, Trajectory
from streamrl.sources.files import prompt_key_of
from streamrl.sources.logged import LoggedCompletion, load_completions

SEED_OFFSET = 3  # the row draws' seed: the run's seed + 3


def advantage_batches(
    rows: list[Trajectory],
    advantages: torch.Tensor,
    examples_per_step: int,
    sampling: str,
    seed: int,
    pad_id: int,
) -> Iterator[Batch]:
    """Endless batches of positive-advantage rows with their (N, T) advantages.

    ``priority``: drawn with replacement in proportion to the advantage (the paper's
    best variant); ``uniform``: in shuffled epochs."""
    rng = random.Random(seed)
    weights = advantages.tolist()
    epochs = shuffled_epochs(len(rows), rng)
    while True:
        if sampling == "priority":
            picked = rng.choices(range(len(rows)), weights=weights, k=examples_per_step)
        else:
            picked = [next(epochs) for _ in range(examples_per_step)]
        batch = Batch.collate([rows[i] for i in picked], pad_id=pad_id)
        batch.advantages = broadcast_to_tokens(advantages[picked], batch.loss_mask)  # (N, T)
        yield batch


def prompt_indices(logged: list[LoggedCompletion]) -> list[int]:
    """Each row's prompt, numbered in order of first appearance."""
    prompts: dict[str, int] = {}
    return [prompts.setdefault(prompt_key_of(row.item), len(prompts)) for row in logged]


def positive_advantages(
    logged: list[LoggedCompletion], baseline: str, path: str
) -> tuple[torch.Tensor, list[int]]:
    """(N,) advantages R - V(x) of the logged rows and the indices of the positive ones
    (what A-LoL trains on); none positive is a ValueError (preflight checks it)."""
    rewards = torch.tensor([row.reward for row in logged])
    prompt_index = torch.tensor(prompt_indices(logged))
    advantages = rewards - reference_value(rewards, prompt_index, baseline)  # (N,)
    positive = (advantages > 0).nonzero().flatten().tolist()
    if not positive:
        raise ValueError(
            f"alol.path={path}: no logged completion has a reward above its baseline "
            f"(alol.baseline={baseline}), so A-LoL has nothing to train on"
        )
    return advantages, positive


def encode_rows(
    tokenizer: Any, logged: list[LoggedCompletion], max_len: int | None, path: str
) -> list[Trajectory]:
    """The logged completions as trajectories with their reward and prompt index."""
    rows = []
    for row, prompt in zip(logged, prompt_indices(logged), strict=True):
        traj = encode_logged(
            tokenizer,
            row.item,
            row.completion,
            max_len=max_len,
            source=path,
            line=row.line,
            field="completion",
        )
        traj.reward = row.reward
        traj.item_index = prompt
        rows.append(traj)
    return rows


def build_alol_stage(alol: ALoLConfig, inputs: StageInputs) -> StageData:
    """The A-LoL stage's data (the positive-advantage rows), loss and reference."""
    path, trainer = str(alol.path), inputs.trainer
    logged = load_completions(path)
    rows = encode_rows(inputs.tokenizer, logged, inputs.max_len, path)
    advantages, positive = positive_advantages(logged, alol.baseline, path)
    kept = [rows[i] for i in positive]
    max_tokens = max(t.num_generated for t in kept)
    reference = trainer.frozen_copy()

    def prepare(batch: Batch) -> Batch:
        # the logged data is treated as pi_ref's samples: its log-probs are the behaviour's
        batch.behavior_logprobs = reference_logprobs(trainer, reference, batch)
        return batch

    params = PolicyLossParams(
        clip_low=alol.clip,
        clip_high=alol.clip,
        agg_mode="seq_mean_token_sum_norm",
        max_tokens=max_tokens,
    )
    batches = advantage_batches(
        kept,
        advantages[positive],
        alol.examples_per_step,
        alol.sampling,
        inputs.seed + SEED_OFFSET,
        pad_id(inputs.tokenizer),
    )
    return StageData(
        batches=batches,
        loss_fn=RLLoss("alol", params),
        prepare=prepare,
        reference=reference,
        summary={
            "rows": float(len(rows)),
            "prompts": float(len({r.item_index for r in rows})),
            "positive_rows": float(len(kept)),
            "reward_mean": float(torch.tensor([r.reward for r in rows]).mean()),
        },
    )


def check_alol_file(alol: ALoLConfig, encode: Encode) -> None:
    """Every row reads and goes through ``encode``; some row has a positive advantage."""
    rows = load_completions(alol.path)
    for row in rows:
        where = {"source": str(alol.path), "line": row.line, "field": "completion"}
        encode(row.item, row.completion, **where)
    positive_advantages(rows, alol.baseline, str(alol.path))

"""The DPO stage: direct preference optimisation on logged (prompt, chosen, rejected)
pairs against a frozen reference, the policy at the start of the stage.

    pairs = load_preferences(dpo.path)                   # file:line: field errors
    batch = chosen_0, rejected_0, chosen_1, rejected_1, ...   (pairs_per_step pairs)
    batch.ref_logprobs = reference's log-probs           # prepare, every step
    trainer.train_batch(batch, DPOLoss(dpo.loss, dpo.beta))
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from streamrl.algorithms.base import pad_id
from streamrl.algorithms.dpo import DPOLoss
from streamrl.algorithms.stages.base import (
    Encode,
    StageData,
    StageInputs,
    encode_logged,
    reference_logprobs,
    shuffled_epochs,
)
from streamrl.config import DPOConfig
from streamrl.core.types import Batch, Trajectory
from streamrl.sources.logged import PreferencePair, load_preferences

SEED_OFFSET = 2  # the pair order's seed: cfg.seed + 2 (SFT's demonstrations use + 1)


def pair_batches(
    pairs: list[tuple[Trajectory, Trajectory]], pairs_per_step: int, seed: int, pad_id: int
) -> Iterator[Batch]:
    """Endless batches of ``pairs_per_step`` (chosen, rejected) pairs in adjacent rows,
    in epochs shuffled with ``random.Random(seed)``."""
    order = shuffled_epochs(len(pairs), random.Random(seed))
    while True:
        picked = [next(order) for _ in range(pairs_per_step)]
        yield Batch.collate([row for i in picked for row in pairs[i]], pad_id=pad_id)


def build_dpo_stage(dpo: DPOConfig, inputs: StageInputs) -> StageData:
    """The DPO stage's data, loss and reference (a frozen copy of the current policy)."""
    path, trainer = str(dpo.path), inputs.trainer
    pairs = [
        encode_pair(inputs.tokenizer, pair, k, max_len=inputs.max_len, path=path)
        for k, pair in enumerate(load_preferences(path))
    ]
    reference = trainer.frozen_copy()

    def prepare(batch: Batch) -> Batch:
        batch.ref_logprobs = reference_logprobs(trainer, reference, batch)
        return batch

    pad = pad_id(inputs.tokenizer)
    return StageData(
        batches=pair_batches(pairs, dpo.pairs_per_step, inputs.seed + SEED_OFFSET, pad),
        loss_fn=DPOLoss(dpo.loss, dpo.beta),
        prepare=prepare,
        reference=reference,
        summary={"pairs": float(len(pairs))},
    )


def encode_pair(
    tokenizer: Any, pair: PreferencePair, k: int, *, max_len: int | None, path: str
) -> tuple[Trajectory, Trajectory]:
    """Logged pair ``k`` as its (chosen, rejected) rows, both carrying the pair's index."""
    encoded = tuple(
        encode_logged(
            tokenizer,
            pair.item,
            text,
            max_len=max_len,
            source=path,
            line=pair.line,
            field=field,
        )
        for field, text in (("chosen", pair.chosen), ("rejected", pair.rejected))
    )
    for traj in encoded:
        traj.item_index = k
    return encoded[0], encoded[1]


def check_dpo_file(dpo: DPOConfig, encode: Encode) -> None:
    """Every pair reads (a bad row is a DataError naming file, line and field), and its
    chosen and rejected completions go through ``encode`` as the stage encodes them."""
    for row in load_preferences(dpo.path):
        for field in ("chosen", "rejected"):
            where = {"source": str(dpo.path), "line": row.line, "field": field}
            encode(row.item, getattr(row, field), **where)

"""Supervised warm-start on demonstrations, run before RL in the same run.

Demonstrations are the task's own reference answers (``item.answer``), with a
configurable fraction corrupted so the warm-started policy is imperfect and RL
has something to fix, as with real noisy SFT data.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator

import torch

from streamrl.core.types import Batch, Item, Trajectory
from streamrl.models import encode_prompt, reference_ids

_NUMBER = re.compile(r"^-?\d+$")
MAX_SKIPPED = 10_000  # answerless items in a row before SFT gives up


def corrupt_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: an integer off by a small non-zero amount,
    otherwise the characters shuffled.

    >>> corrupt_answer("46", random.Random(0)) != "46"
    True
    """
    if _NUMBER.match(answer.strip()):
        delta = rng.choice([-10, -2, -1, 1, 2, 10])
        return str(int(answer) + delta)
    chars = list(answer)
    for _ in range(5):
        rng.shuffle(chars)
        if "".join(chars) != answer:
            break
    return "".join(chars)


def demonstration(tokenizer, item: Item, completion: str) -> Trajectory:
    """Prompt (masked) + completion + EOS (trained)."""
    prompt_ids = encode_prompt(tokenizer, item)
    target_ids = reference_ids(tokenizer, completion)
    n_p, n_t = len(prompt_ids), len(target_ids)
    return Trajectory(
        input_ids=torch.tensor(prompt_ids + target_ids, dtype=torch.long),
        loss_mask=torch.tensor([False] * n_p + [True] * n_t),
        behavior_logprobs=torch.zeros(n_p + n_t),
        versions=torch.full((n_p + n_t,), -1, dtype=torch.long),
        reward=0.0,
        item_index=item.index,
    )


def sft_batches(
    tokenizer,
    items: Iterator[Item],
    batch_size: int,
    corrupt_fraction: float,
    seed: int,
    replay: Callable[[Item], Trajectory] | None = None,
) -> Iterator[Batch]:
    """Endless batches of demonstrations; skips items without a reference answer (and
    fails, instead of searching forever, when ``MAX_SKIPPED`` in a row have none).

    An item with a teacher trace (``metadata["demonstration"]``: assistant turns) becomes
    ``replay(item)``, the trace rendered through the run's own episode (multi-turn agent
    traces: tool calls executed, observations masked); corruption applies to plain
    answers only."""
    rng = random.Random(seed)
    pad = tokenizer.pad_token_id or 0
    while True:
        demos, skipped = [], 0
        while len(demos) < batch_size:
            item = next(items)
            if item.answer is None:
                skipped += 1
                if skipped >= MAX_SKIPPED:
                    raise ValueError(
                        f"SFT needs demonstrations, but {skipped} items in a row have no "
                        "answer; set sft.steps=0 or add answers to the data"
                    )
                continue
            if replay is not None and "demonstration" in item.metadata:
                demos.append(replay(item))
                continue
            answer = item.answer
            if rng.random() < corrupt_fraction:
                answer = corrupt_answer(answer, rng)
            demos.append(demonstration(tokenizer, item, answer))
        yield Batch.collate(demos, pad_id=pad)


def run_sft(
    trainer,
    batches: Iterator[Batch],
    steps: int,
    loss_fn,
    on_step: Callable[[int, dict], bool | None],
    start: int = 0,
    prepare: Callable[[Batch], Batch] | None = None,
) -> tuple[int, dict[str, float]]:
    """Optimizer steps ``start .. steps-1`` of ``loss_fn`` (token-mean NLL for SFT; any
    stage's loss), each batch first through ``prepare`` (e.g. a reference's log-probs).
    ``on_step`` returning True stops early. Returns (steps completed, the last metrics)."""
    metrics: dict[str, float] = {}
    for step in range(start, steps):
        batch = next(batches)
        metrics = trainer.train_batch(prepare(batch) if prepare else batch, loss_fn)
        if on_step(step, metrics):
            return step + 1, metrics
    return steps, metrics

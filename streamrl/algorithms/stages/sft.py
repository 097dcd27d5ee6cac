"""The SFT stage: supervised warm-start on demonstrations, run before RL in the same run.

Demonstrations are the task's own reference answers (``item.answer``), with a
configurable fraction corrupted so the warm-started policy is imperfect and RL
has something to fix, as with real noisy SFT data. An item with a teacher trace
(``metadata["demonstration"]``) is replayed through the run's episode instead.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from streamrl.algorithms.base import pad_id
from streamrl.algorithms.losses import sft_loss
from streamrl.algorithms.stages.base import StageData, StageInputs, demonstration
from streamrl.config import SFTConfig
from streamrl.core.types import Batch, Item, Trajectory

_NUMBER = re.compile(r"^-?\d+$")
MAX_SKIPPED = 10_000  # answerless items in a row before SFT gives up
SEED_OFFSET = 1  # the demonstrations' item order: seed + 1 (DPO's pairs use + 2)


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
    pad = pad_id(tokenizer)
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


@runtime_checkable
class ReplaysTraces(Protocol):
    """An episode that renders a teacher trace (an item's ``metadata["demonstration"]``:
    assistant turns) as a trajectory (multi-turn agent traces: tool calls executed,
    observations masked)."""

    def replay(self, item: Item) -> Trajectory: ...


def build_sft_stage(section: SFTConfig, inputs: StageInputs) -> StageData:
    """The SFT stage's demonstrations (the task's items in the order of seed + 1) and its
    token-mean negative log-likelihood."""
    if inputs.items is None or inputs.episode is None:
        raise ValueError("the SFT stage needs the task's items and the run's episode")
    episode = inputs.episode()
    batches = sft_batches(
        inputs.tokenizer,
        inputs.items(inputs.seed + SEED_OFFSET),
        section.examples_per_step,
        section.corrupt_fraction,
        inputs.seed,
        replay=episode.replay if isinstance(episode, ReplaysTraces) else None,
    )
    return StageData(batches, sft_loss)

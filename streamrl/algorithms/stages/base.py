"""What the controller runs as a stage before RL: batches, a loss and per-step extras.

SFT, DPO and A-LoL are all a :class:`Stage`: a builder that turns its config section
and the :class:`StageInputs` into a :class:`StageData`, run by the same loop
(``Session.train_stage``): a fresh optimizer, ``steps`` calls of
``trainer.train_batch(prepare(next(batches)), loss_fn)``, metrics in
``<stage>_metrics.jsonl``, checkpoints every ``run.checkpoint_every`` steps and at the
end. ``batches`` is model-free and deterministic for the seed, so a stage continued from
a checkpoint skips the batches it already trained on; ``prepare`` adds what needs a
forward pass (the frozen reference's log-probs).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from streamrl.core.loss import LossFn
from streamrl.core.types import Batch, Item, Trajectory
from streamrl.models import encode_prompt, reference_ids
from streamrl.sources.base import DataError


@dataclass
class StageData:
    """One pre-RL stage's inputs. ``reference``: a frozen model the stage owns (the
    policy at the stage's start), saved in its checkpoints; ``summary``: facts about the
    stage's data for ``summary.json`` (prefixed with the stage's name)."""

    batches: Iterator[Batch]
    loss_fn: LossFn
    prepare: Callable[[Batch], Batch] | None = None
    reference: torch.nn.Module | None = None
    summary: dict[str, float] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        return {"reference": {k: v.detach().cpu() for k, v in self.reference.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the reference of a stage continued from one of its checkpoints."""
        if self.reference is not None:
            self.reference.load_state_dict(state["reference"])


@dataclass
class StageInputs:
    """What a stage may use beyond its config section; the controller fills it.

    ``max_len``: the model's context (logged rows longer than it are errors);
    ``items(seed)``: the task's training items in the order of ``seed`` (SFT's
    demonstrations); ``episode()``: builds the run's episode (SFT replays teacher traces
    through it)."""

    tokenizer: Any
    trainer: Any
    seed: int
    max_len: int | None = None
    items: Callable[[int], Iterator[Item]] | None = None
    episode: Callable[[], Any] | None = None


#: ``encode(item, text, source=..., line=..., field=...)``: how preflight checks a logged
#: file's texts against the model (a no-op without one)
Encode = Callable[..., Any]


class Stage(Protocol):
    """A pre-RL stage: its section (``cfg.<name>``) and the inputs -> its data."""

    def __call__(self, section: Any, inputs: StageInputs) -> StageData: ...


def shuffled_epochs(n: int, rng: random.Random) -> Iterator[int]:
    """0 .. n-1 in a fresh random order each epoch, forever."""
    order = list(range(n))
    while True:
        rng.shuffle(order)
        yield from order


def context_length(model: torch.nn.Module) -> int | None:
    """The longest sequence the model takes (``max_position_embeddings``), if it says."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def demonstration(tokenizer: Any, item: Item, completion: str) -> Trajectory:
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


def encode_logged(
    tokenizer: Any,
    item: Item,
    completion: str,
    *,
    max_len: int | None,
    source: str,
    line: int,
    field: str,
) -> Trajectory:
    """A logged completion as a trajectory: the prompt rendered as the task source renders
    it (masked), then the completion and EOS (trained), tokenized exactly as an SFT
    demonstration. Longer than ``max_len`` tokens: a DataError naming file, line, field."""
    traj = demonstration(tokenizer, item, completion)
    n = int(traj.input_ids.numel())
    if max_len is not None and n > max_len:
        raise DataError(
            source,
            f"prompt + completion is {n} tokens, longer than the model's context of "
            f"{max_len} tokens",
            line=line,
            field=field,
        )
    return traj


def reference_logprobs(trainer: Any, reference: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(N, T) token log-probs of ``batch`` under the frozen reference, through the train
    engine's own forward (the same numerics as the policy's log-probs in the loss)."""
    return trainer.compute_logprobs(batch, model=reference)


def run_stage(
    trainer: Any,
    batches: Iterator[Batch],
    steps: int,
    loss_fn: LossFn,
    on_step: Callable[[int, dict], bool | None],
    start: int = 0,
    prepare: Callable[[Batch], Batch] | None = None,
) -> tuple[int, dict[str, float]]:
    """A stage's optimizer steps ``start .. steps-1`` of ``loss_fn`` (SFT's token-mean NLL,
    DPO's, A-LoL's), each batch first through ``prepare`` (e.g. a reference's log-probs).
    ``on_step`` returning True stops early. Returns (steps completed, the last metrics)."""
    metrics: dict[str, float] = {}
    for step in range(start, steps):
        batch = next(batches)
        metrics = trainer.train_batch(prepare(batch) if prepare else batch, loss_fn)
        if on_step(step, metrics):
            return step + 1, metrics
    return steps, metrics

"""SFT interleaved with RL (ReLIFT / SASR-style): demonstrations for the prompts the policy
fails most, trained by likelihood inside the RL steps (``algorithm.interleaved_sft``).

Any policy-gradient algorithm (its loss an :class:`~streamrl.algorithms.losses.RLLoss`) is
wrapped when ``algorithm.interleaved_sft.share > 0``: its ``prepare`` builds the RL batch
from the stream's groups as always (same stream, same staleness bound), then
``share / (1 - share)`` demonstration rows per RL row are appended (a fractional remainder
carried to the next step, so the share holds over steps), flagged in
``Batch.demonstration``. The loss is

    loss = (U_rl * L_rl + weight * U_demo * NLL_demo) / (U_rl + U_demo)

with L_rl the wrapped loss on the RL rows, NLL_demo the demonstrations' negative
log-likelihood, both aggregated with the RL loss's ``agg_mode``, U their units (tokens or
sequences): the demonstrations' tokens join the batch's average with a per-token loss of
``weight * NLL``, so micro-batch accumulation stays exact (the engine's contract).

Demonstrations (``source``):

- ``successes``: the policy's own verified successes (reward above
  ``success_threshold``), the latest one per prompt, ``buffer_size`` prompts kept (the
  oldest dropped). A hinted success (``selection.kind: hints``) is kept with its hint
  tokens trained, so the policy learns the whole solution without the hint (in the
  prompt mode the demonstration keeps the hinted prompt). Each is used once.
- ``file``: JSONL rows (``prompt`` or ``messages``, and ``answer``), reused.
- ``reference`` (ReLIFT): a prompt whose group came out all wrong (dropped by dynamic
  sampling) gets its item's reference answer, rendered with ``solution_format``, as its
  demonstration: the sample's prompt tokens (masked; a forced hint prefix not included),
  then the answer and EOS (trained). The latest per prompt, ``buffer_size`` prompts kept,
  each used once. An item without a reference answer gets none (counted:
  ``no_reference`` in the checkpoint, a warning in the log the first time).

Which: the prompts with the lowest success rate of their unhinted samples first, ties in
a random order. The rates count every scored sample, the dropped groups' too (the rollout
pool hands them back, ``Algorithm.wants_dropped``): a prompt that is always wrong ranks
first even though none of its groups reaches a batch. The buffer, the per-prompt rates,
the carried remainder and the random generator are in the algorithm's checkpoint (the
dropped groups not yet handed back in the pool's), so a resume continues bit-exactly.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from streamrl.algorithms.base import Algorithm, Filtered, Timer, pad_id, register_wrapper
from streamrl.algorithms.losses import RLLoss, aggregate, loss_weight
from streamrl.algorithms.stages.base import demonstration
from streamrl.config.hints import InterleavedSFTConfig
from streamrl.core.loss import LossFn
from streamrl.core.messages import DroppedGroup
from streamrl.core.sample import Sample
from streamrl.core.types import HINT_KEY, Batch, Trajectory
from streamrl.models import reference_ids
from streamrl.sources.files import JsonlTaskSource

log = logging.getLogger(__name__)
_PAD = {"input_ids": None, "versions": -1}  # fill of padded positions (None: pad id)


def split_masks(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) loss masks of the RL rows and of the demonstration rows."""
    demo = batch.demonstration
    if demo is None:
        return batch.loss_mask, torch.zeros_like(batch.loss_mask)
    rows = demo.to(batch.loss_mask.device)[:, None]
    return batch.loss_mask & ~rows, batch.loss_mask & rows


def rl_rows(batch: Batch) -> Batch:
    """The batch without its demonstration rows (the step metrics describe RL samples);
    a batch kind without demonstrations (environment transitions) is returned as is."""
    demo = getattr(batch, "demonstration", None)
    if demo is None or not bool(demo.any()):
        return batch
    keep = ~demo
    out = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        out[f.name] = v[keep] if isinstance(v, torch.Tensor) else v
    return Batch(**out)


def append_rows(batch: Batch, demos: Batch, pad: int) -> Batch:
    """``batch``'s rows, then ``demos``' (flagged as demonstrations), right-padded to one
    length; a field only ``batch`` has is 0 on the demonstration rows."""
    t = max(batch.input_ids.shape[1], demos.input_ids.shape[1])
    out: dict[str, Any] = {}
    for f in fields(batch):
        a, b = getattr(batch, f.name), getattr(demos, f.name)
        if a is None:
            out[f.name] = None
            continue
        if b is None:
            b = torch.zeros((demos.size, *a.shape[1:]), dtype=a.dtype)
        if a.dim() == 2:
            fill = _PAD.get(f.name, 0)
            fill = pad if fill is None else fill
            a, b = (torch.nn.functional.pad(x, (0, t - x.shape[1]), value=fill) for x in (a, b))
        out[f.name] = torch.cat([a, b.to(a.dtype)])
    flags = [torch.zeros(batch.size, dtype=torch.bool), torch.ones(demos.size, dtype=torch.bool)]
    out["demonstration"] = torch.cat(flags)
    return Batch(**out)


@dataclass(frozen=True)
class InterleavedLoss(LossFn):
    """The wrapped RL loss on the RL rows and ``weight`` * NLL on the demonstration rows,
    averaged over both's units (see the module docstring)."""

    inner: RLLoss
    weight: float

    @property
    def needs_entropy(self) -> bool:
        return self.inner.needs_entropy

    def _units(self, mask: torch.Tensor) -> int:
        return loss_weight(mask, self.inner.params.agg_mode)

    def loss_weight(self, batch: Batch) -> int:
        rl, demo = split_masks(batch)
        return self._units(rl) + self._units(demo)

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Batch
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        rl, demo = split_masks(batch)
        u_rl, u_demo = self._units(rl), self._units(demo)
        logprobs, p = outputs["logprobs"], self.inner.params
        metrics: dict[str, Any] = {}
        loss = logprobs.sum() * 0.0
        if u_rl:
            rl_loss, metrics = self.inner(outputs, replace(batch, loss_mask=rl))
            loss = loss + u_rl * rl_loss
        if u_demo:
            nll = aggregate(-logprobs, demo, p.agg_mode, max_tokens=p.max_tokens)
            loss = loss + self.weight * u_demo * nll
            metrics["sft/nll"] = nll.item()
        metrics["sft/demo_units"] = float(u_demo)
        return loss / max(u_rl + u_demo, 1), metrics


def prompt_length(t: Trajectory) -> int:
    """Tokens of ``t``'s prompt, a forced hint prefix not counted."""
    generated = torch.nonzero(t.loss_mask)
    start = int(generated[0]) if generated.numel() else int(t.loss_mask.shape[0])
    return start - int(t.metadata.get("hint_tokens", 0))


def prompt_key(input_ids: torch.Tensor, length: int) -> str:
    return hashlib.sha1(input_ids[:length].numpy().tobytes()).hexdigest()


class DemoBuffer:
    """The demonstrations by prompt, each prompt's unhinted success rate, the random
    generator that orders ties and the share's carried remainder."""

    def __init__(self, cfg: InterleavedSFTConfig, seed: int) -> None:
        self.cfg = cfg
        self.demos: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.rates: dict[str, list[int]] = {}  # prompt -> [successes, samples] unhinted
        self.rng = random.Random(seed)
        self.owed = 0.0
        self.reuse = cfg.source == "file"
        self.no_reference = 0  # all-wrong groups whose item had no reference answer

    def load_file(self, tokenizer: Any, path: str) -> None:
        for item in JsonlTaskSource(path, heldout_fraction=1.0).heldout():  # every row
            if item.answer is None:
                continue
            t = demonstration(tokenizer, item, item.answer)
            self.demos[prompt_key(t.input_ids, prompt_length(t))] = (t.input_ids, t.loss_mask)

    def observe(self, samples: list[Sample]) -> None:
        """Each sample's success into its prompt's rate; successes into the buffer."""
        for t in samples:
            n = prompt_length(t)
            key, won = prompt_key(t.input_ids, n), float(t.reward) > self.cfg.success_threshold
            if HINT_KEY not in t.metadata:
                rate = self.rates.setdefault(key, [0, 0])
                rate[0], rate[1] = rate[0] + int(won), rate[1] + 1
            if won and self.cfg.source == "successes":
                mask = t.loss_mask.clone()
                mask[n : n + int(t.metadata.get("hint_tokens", 0))] = True
                self.keep(key, t.input_ids, mask)

    def keep(self, key: str, input_ids: torch.Tensor, mask: torch.Tensor) -> None:
        """``key``'s demonstration (the latest), the oldest prompt dropped past the size."""
        self.demos[key] = (input_ids, mask)
        self.demos.move_to_end(key)
        while len(self.demos) > self.cfg.buffer_size:
            self.demos.popitem(last=False)

    def observe_dropped(self, groups: list[DroppedGroup], tokenizer: Any) -> None:
        """The dropped groups' samples into the rates; with source=reference, an all-wrong
        group's reference answer into the buffer (its prompt tokens, then the answer)."""
        for g in groups:
            self.observe(g.samples)
            threshold = self.cfg.success_threshold
            if self.cfg.source != "reference" or not g.samples:
                continue
            if any(float(t.reward) > threshold for t in g.samples):
                continue
            if not g.answer:
                if not self.no_reference:
                    log.warning("interleaved_sft: item %d has no reference answer", g.item_index)
                self.no_reference += 1
                continue
            t = g.samples[0]
            n = prompt_length(t)
            text = self.cfg.solution_format.replace("{solution}", g.answer)  # other braces kept
            completion = reference_ids(tokenizer, text)
            ids = torch.cat([t.input_ids[:n], torch.tensor(completion, dtype=torch.long)])
            mask = torch.arange(ids.shape[0]) >= n
            self.keep(prompt_key(t.input_ids, n), ids, mask)

    def rate(self, key: str) -> float:
        wins, n = self.rates.get(key, (0, 0))
        return wins / n if n else 0.5

    def take(self, n: int) -> list[Trajectory]:
        """The demonstrations of the ``n`` prompts failed most (removed unless reused)."""
        ties = {k: self.rng.random() for k in self.demos}
        keys = sorted(self.demos, key=lambda k: (self.rate(k), ties[k]))[:n]
        out = []
        for k in keys:
            ids, mask = self.demos[k] if self.reuse else self.demos.pop(k)
            zeros = torch.zeros(ids.shape[0])
            out.append(Trajectory(ids, mask, zeros, torch.full_like(ids, -1), 0.0))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "demos": list(self.demos.items()) if not self.reuse else None,
            "rates": {k: list(v) for k, v in self.rates.items()},
            "rng": self.rng.getstate(),
            "owed": self.owed,
            "no_reference": self.no_reference,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["demos"] is not None:
            self.demos = OrderedDict(state["demos"])
        self.rates = {k: list(v) for k, v in state["rates"].items()}
        self.rng.setstate(state["rng"])
        self.owed = state["owed"]
        self.no_reference = state.get("no_reference", 0)


class InterleavedSFT(Algorithm):
    """A policy-gradient algorithm with demonstrations mixed into its batches."""

    wants_dropped = True  # the dropped groups count in the rates (and give references)

    def __init__(self, inner: Algorithm) -> None:
        super().__init__(inner.cfg, inner.run)
        self.inner, self.section = inner, inner.cfg.interleaved_sft
        if not isinstance(inner.loss_fn, RLLoss):
            raise ValueError(
                f"algorithm.interleaved_sft needs a policy-gradient algorithm (an RL loss on "
                f"sampled tokens); algorithm.name={inner.cfg.name} trains "
                f"{type(inner.loss_fn).__name__}: set algorithm.interleaved_sft.share=0"
            )
        self.extra_rollouts = inner.extra_rollouts
        self.buffer = DemoBuffer(self.section, inner.run.seed)
        self._loss = InterleavedLoss(inner.loss_fn, self.section.weight)
        self.pad_id = 0
        self.tokenizer: Any = None

    @property
    def loss_fn(self) -> InterleavedLoss:
        return self._loss

    def finish_group(
        self, samples: list[Sample], extras: dict[str, Sample]
    ) -> list[Sample] | Filtered:
        return self.inner.finish_group(samples, extras)

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        self.inner.setup(trainer, tokenizer)
        self.pad_id, self.tokenizer = pad_id(tokenizer), tokenizer
        if self.section.source == "file":
            self.buffer.load_file(tokenizer, str(self.section.path))

    def observe_dropped(self, groups: list[DroppedGroup]) -> None:
        self.buffer.observe_dropped(groups, self.tokenizer)

    def prepare(self, groups: list, trainer: Any, timer: Timer) -> Batch:
        batch = self.inner.prepare(groups, trainer, timer)
        with timer("demonstrations"):
            per_row = self.section.share / (1 - self.section.share)
            buf = self.buffer
            buf.owed = min(buf.owed + per_row * batch.size, per_row * batch.size + 1)
            demos = buf.take(int(buf.owed))
            buf.owed -= len(demos)
            buf.observe([t for g in groups for t in g.trajectories])
            if demos:
                batch = append_rows(batch, Batch.collate(demos, self.pad_id), self.pad_id)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "interleaved_sft": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        if "interleaved_sft" in state:
            self.buffer.load_state_dict(state.pop("interleaved_sft"))
        self.inner.load_state_dict(state)


@register_wrapper
def interleave(algo: Algorithm) -> Algorithm:
    """``algorithm.interleaved_sft.share > 0``: the algorithm with demonstrations mixed in."""
    return algo if algo.cfg.interleaved_sft.share == 0 else InterleavedSFT(algo)

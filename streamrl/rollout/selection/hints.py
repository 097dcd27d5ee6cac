"""Hints for prompts the policy always fails (``selection.kind: hints``, Guide / GHPO-style).

Group-relative RL learns nothing from a group whose samples are all wrong. This sampler
keeps, per prompt (``Item.id``), a Beta posterior over the success rate of its unhinted
groups; once it predicts P(all group_size samples wrong) above ``selection.hints.threshold``
(with the Beta(1, 1) prior: after one all-wrong group) the prompt's next group gets a hint,
a prefix of its reference solution (:mod:`.hint_solutions`) of ``initial_fraction`` of the
solution's tokens. Each hinted group moves the prompt's hint length: a success share of at
least ``shorten_above`` shortens it by ``step`` (at 0 the prompt is back to unhinted
groups, its posterior reset to the prior), an all-wrong one lengthens it (up to
``max_fraction``). A prompt that needs a hint is issued again ahead of fresh items (at most
``revisit_share`` of the issued items, ``max_revisits`` times in a row), so "the next
group" comes soon even from a source that never repeats.

The hint's mode (``prefix``: forced at the start of the completion, masked from the loss;
``prompt``: appended to the prompt) is carried in the item's metadata (``HINT_KEY``) and
rendered on the rollout worker with its tokenizer; every sample of a hinted group carries
it, so the step metrics split rewards and advantages by hinted and not (``hints/*``).
An item with no reference solution is never hinted: it is counted
(``hints/no_reference``) and said once on the console.

Determinism (η = 0 bit-exact, also across a resume) as in ``posterior.py``: outcomes are
pending until the trainer publishes, then taken in item-index order for the items that
ended; a checkpoint keeps the pending outcomes of ended items only.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from streamrl.config.hints import HintsConfig
from streamrl.core.engine import InferenceEngine
from streamrl.core.types import HINT_KEY, Item, Trajectory
from streamrl.rollout.selection.base import GroupSampler, Report, Roll, SamplerContext, SamplerSetup
from streamrl.rollout.selection.draws import Draws, independent
from streamrl.rollout.selection.hint_solutions import reference_solution, render_hint
from streamrl.rollout.selection.registry import register_sampler

log = logging.getLogger(__name__)


def all_wrong_probability(a: float, b: float, group_size: int) -> float:
    """P(all ``group_size`` Bernoulli(p) outcomes fail) with p ~ Beta(a, b).

    >>> round(all_wrong_probability(1.0, 5.0, 4), 6) == round(5 / 9, 6)
    True
    """
    p = 1.0
    for k in range(group_size):
        p *= (b + k) / (a + b + k)
    return p


COUNTERS = (
    "issued",
    "hinted",
    "revisits",
    "no_reference",
    "shortened",
    "lengthened",
    "graduated",
    "queue_dropped",
)


@dataclass
class PromptHint:
    """One prompt's unhinted evidence and its hint length (None: no hint)."""

    successes: float = 0.0
    failures: float = 0.0
    fraction: float | None = None
    revisits: int = 0


class HintSchedule:
    """The per-prompt hint lengths, the revisit queue and the counters (pool side)."""

    def __init__(
        self, cfg: HintsConfig, group_size: int, prior: tuple[float, float], success: float
    ):
        self.cfg, self.group_size, self.prior, self.success = cfg, group_size, prior, success
        self.prompts: dict[str, PromptHint] = {}
        self.pending: dict[int, tuple[Item, tuple[float, ...], float | None]] = {}
        self.queue: deque[Item] = deque()
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.warned = False

    def p_all_wrong(self, st: PromptHint) -> float:
        a0, b0 = self.prior
        return all_wrong_probability(a0 + st.successes, b0 + st.failures, self.group_size)

    def issue(self, draw: Any) -> Item:
        c = self.counts
        if self.queue and c["revisits"] < self.cfg.revisit_share * (c["issued"] + 1):
            item, c["revisits"] = copy.deepcopy(self.queue.popleft()), c["revisits"] + 1
        else:
            item = draw()
        c["issued"] += 1
        st = self.prompts.get(item.id)
        if st is None or st.fraction is None:
            return item
        solution = reference_solution(item)
        if solution is None:  # (a prompt is given a fraction only when it has one)
            return item
        c["hinted"] += 1
        hint = {"fraction": st.fraction, "mode": self.cfg.mode}
        hint["solution"] = self.cfg.solution_format.format(solution=solution)
        item.metadata = {**item.metadata, HINT_KEY: hint}
        return item

    def observe(self, item: Item, index: int, rewards: tuple[float, ...]) -> None:
        hint = item.metadata.get(HINT_KEY)
        plain = copy.copy(item)
        plain.metadata = {k: v for k, v in item.metadata.items() if k != HINT_KEY}
        self.pending[index] = (plain, rewards, None if hint is None else hint["fraction"])

    def advance(self, outstanding: set[int]) -> None:
        for index in sorted(i for i in self.pending if i not in outstanding):
            item, rewards, fraction = self.pending.pop(index)
            if rewards:  # (failed or rejected before scoring: no evidence)
                self._outcome(item, rewards, fraction)

    def _outcome(self, item: Item, rewards: tuple[float, ...], fraction: float | None) -> None:
        st = self.prompts.setdefault(item.id, PromptHint())
        wins = sum(r > self.success for r in rewards)
        cfg, c = self.cfg, self.counts
        if fraction is None:
            st.successes, st.failures = st.successes + wins, st.failures + len(rewards) - wins
            if st.fraction is not None or self.p_all_wrong(st) <= cfg.threshold:
                return
            if reference_solution(item) is None:
                self._no_reference(item)
                return
            st.fraction = cfg.initial_fraction
        elif wins >= cfg.shorten_above * len(rewards):
            st.fraction, c["shortened"] = round(fraction - cfg.step, 9), c["shortened"] + 1
            if st.fraction <= 0:  # graduated: the next group tests the prompt unhinted
                st.fraction, st.successes, st.failures = None, 0.0, 0.0
                c["graduated"] += 1
        elif wins == 0:
            st.fraction = min(cfg.max_fraction, round(fraction + cfg.step, 9))
            c["lengthened"] += 1
        self._revisit(item, st)

    def _revisit(self, item: Item, st: PromptHint) -> None:
        if st.revisits >= self.cfg.max_revisits or self.cfg.revisit_share == 0:
            st.revisits = 0  # (it waits for the source to yield it again)
            return
        st.revisits += 1
        self.queue.append(item)
        if len(self.queue) > self.cfg.max_queue:
            self.queue.popleft()
            self.counts["queue_dropped"] += 1

    def _no_reference(self, item: Item) -> None:
        self.counts["no_reference"] += 1
        if not self.warned:
            self.warned = True
            log.warning(
                "selection.kind=hints: item %r has no reference solution (metadata "
                "'solution', arithmetic operands or an answer): it gets no hint "
                "(counted in hints/no_reference)",
                item.id,
            )

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        return {
            "prompts": {k: vars(v).copy() for k, v in self.prompts.items()},
            "pending": {i: p for i, p in self.pending.items() if i not in outstanding},
            "queue": list(self.queue),
            "counts": dict(self.counts),
            "warned": self.warned,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts = {k: PromptHint(**v) for k, v in state["prompts"].items()}
        self.pending = dict(state["pending"])
        self.queue = deque(state["queue"])
        self.counts.update(state["counts"])
        self.warned = state["warned"]

    def metrics(self) -> dict[str, float]:
        active = [st.fraction for st in self.prompts.values() if st.fraction is not None]
        m = {f"hints/{k}": float(v) for k, v in self.counts.items()}
        m["hints/active"] = float(len(active))
        m["hints/fraction_mean"] = sum(active) / len(active) if active else 0.0
        return m


@register_sampler("hints")
class HintSampler(GroupSampler):
    """``selection.kind: hints`` (see the module docstring): the pool's side schedules
    the hints, the worker's side renders them with its tokenizer."""

    own_options = {"hints": (HintsConfig(), "only selection.kind=hints gives hints")}

    def __init__(
        self,
        schedule: HintSchedule | None,
        setup: SamplerSetup | None = None,
        draws: Draws = independent,
    ) -> None:
        super().__init__(draws)
        self.schedule = schedule
        self.tokenizer = None if setup is None else setup.tokenizer
        self.template = "" if setup is None else setup.selection.hints.hint_template
        self._lock = threading.Lock()

    @classmethod
    def build(cls, setup: SamplerSetup) -> HintSampler:
        sel = setup.selection
        prior = (sel.prior_alpha, sel.prior_beta)
        schedule = HintSchedule(sel.hints, setup.group_size, prior, sel.success_threshold)
        return cls(schedule, setup, setup.draws)

    @classmethod
    def check(cls, run: SamplerContext) -> None:
        """Forced prefixes are a single-turn episode's; a hint in the prompt works anywhere."""
        if run.selection.hints.mode == "prefix" and run.rollout.episode != "single_turn":
            raise ValueError(
                f"selection.hints.mode=prefix forces the completion's start, which only "
                f"rollout.episode=single_turn does (got {run.rollout.episode!r}); use "
                "selection.hints.mode=prompt"
            )

    # ------------------------------------------------------------ the pool's side

    def issue(self, index: int) -> Item:
        with self._lock:
            return self.schedule.issue(self.source.draw)

    def finished(self, item: Item, report: Report) -> None:
        with self._lock:
            self.schedule.observe(item, report.item_index, tuple(report.rewards))

    def published(self, version: int, outstanding: set[int]) -> None:
        with self._lock:
            self.schedule.advance(outstanding)

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        with self._lock:
            return self.schedule.state_dict(outstanding)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.schedule.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        with self._lock:
            return self.schedule.metrics()

    # ------------------------------------------------------------ the worker's side

    async def rollout(
        self, engine: InferenceEngine, item: Item, plan: Any, roll: Roll
    ) -> Report | None:
        if HINT_KEY in item.metadata and "text" not in item.metadata[HINT_KEY]:
            item = render_hint(item, self.tokenizer, self.template)
        return await roll(item)


def hint_metrics(samples: list[Trajectory], advantages: torch.Tensor | None) -> dict[str, float]:
    """A batch's rewards and advantages (per sample: the mean over its loss tokens) split by
    hinted (``hints/*_hinted``) and not (``*_plain``), its hinted share and mean hint
    length; {} when no sample of the batch was hinted. ``advantages``: (N, T) aligned with
    ``samples`` (None: rewards only)."""
    hinted = [HINT_KEY in t.metadata for t in samples]
    if not any(hinted):
        return {}
    m = {"hints/hinted_share": sum(hinted) / len(samples)}
    lengths = [
        t.metadata[HINT_KEY].get("tokens", 0) for t, h in zip(samples, hinted, strict=True) if h
    ]
    m["hints/hint_tokens_mean"] = sum(lengths) / len(lengths)
    per_sample = None
    if advantages is not None and advantages.shape[0] == len(samples):
        per_sample = [_mean_advantage(advantages[i], t) for i, t in enumerate(samples)]
    for name, flag in (("hinted", True), ("plain", False)):
        rows = [i for i, h in enumerate(hinted) if h is flag]
        if not rows:
            continue
        m[f"hints/reward_{name}"] = sum(float(samples[i].reward) for i in rows) / len(rows)
        if per_sample is not None:
            m[f"hints/adv_{name}"] = sum(per_sample[i] for i in rows) / len(rows)
            m[f"hints/adv_abs_{name}"] = sum(abs(per_sample[i]) for i in rows) / len(rows)
    return m


def _mean_advantage(row: torch.Tensor, sample: Trajectory) -> float:
    mask = sample.loss_mask
    values = row[: mask.shape[0]][mask]
    return float(values.mean()) if values.numel() else 0.0

"""Prompt selection by the policy's own likelihood (``selection.kind: likelihood``): the
group sampler around the likelihood gate (:mod:`streamrl.rollout.selection.gate`), which
scores an item's reference answer right before its group is generated and skips the
item when the group is predicted all-equal.

Candidates. At a high skip rate, one candidate per issued item makes a chain: score,
skip, report, get the next item, score... one engine step and a round trip through the
stream per link, and late in the main job 90% of items are skipped, so a slot needed
~15 links while the trainer waited. So the pool's side hands each issued item a bundle
of candidates drawn from the task source (:class:`Bundle`;
:class:`~streamrl.rollout.selection.candidates.CandidateBudget` sizes it from the
recent skip rate), the worker's side scores them all in one engine step
(:meth:`LikelihoodGate.choose`) and generates the first one the gate accepts.
Candidates before it are skipped (counted), later ones that were skipped are dropped
(counted), and later ones that were accepted or failed go back to the pool as *spares*,
issued again (and scored again, alone: the gate accepted them a version ago) before any
fresh draw, from the next weight version on. So nothing drawn is lost, every decision is
still a pure function of (weights, item), and at η = 0 which candidates an item gets
does not depend on timing (spares re-enter only at a publish, in item order). After
``selection.max_skips_in_a_row`` skips the next item is generated without the gate.

Scoring ahead (``selection.score_ahead``, at η >= 1). Late in a run most candidates
are skipped, so the scoring is the cost, and it lands on the engine when it is busiest.
But a worker is idle whenever it is ahead of the trainer: the stream admits nothing more
until the trainer consumes. Then the pool's side gives it fresh candidates to score
ahead (:class:`ScoreAhead`, :meth:`LikelihoodGate.score_ahead`); the accepted ones are
held in draw order and issued before anything else, alone, and generated without
scoring again, while their decision is at most ``score_ahead`` weight versions old
(older ones become spares, scored again). Skipped ones are counted like any skip. Not
while the trainer evaluates (:meth:`RolloutPool.work_ahead`), and not at η = 0, where
what an idle worker gets to score would depend on timing.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from streamrl.algorithms import PolicyGradient, algorithm_class
from streamrl.algorithms.base import EQUAL_REWARDS
from streamrl.core.engine import InferenceEngine
from streamrl.core.messages import GroupRejected
from streamrl.core.types import Item
from streamrl.engines.inference.sampling import is_raw
from streamrl.rollout.reports import failed_report
from streamrl.rollout.selection.base import (
    GroupSampler,
    Report,
    Roll,
    SamplerContext,
    SamplerSetup,
    Source,
)
from streamrl.rollout.selection.candidates import CandidateBudget
from streamrl.rollout.selection.draws import Draws, independent
from streamrl.rollout.selection.gate import LikelihoodGate, weighted
from streamrl.rollout.selection.registry import register_sampler

AHEAD_CHUNK = 64  # candidates per ScoreAhead: about one engine step of prefill rows


@dataclass(frozen=True)
class Bundle:
    """An issued item's plan: further candidates (unissued, scored with it in one engine
    step), or ``gated=False``: generate it as it is (forced, or accepted ahead). An item
    without a plan is scored alone."""

    alternates: tuple[Item, ...] = ()
    gated: bool = True


UNGATED = Bundle(gated=False)


@dataclass(frozen=True)
class GateFeedback:
    """What became of each of an item's candidates (``chosen``, ``failed``, ``spare`` or a
    skip reason), and the candidates handed back to the pool (never lost)."""

    outcomes: tuple[str, ...] = ()
    spares: tuple[Item, ...] = ()


@dataclass(frozen=True)
class ScoreAhead:
    """Work for an idle worker: decide for ``items``, not yet issued."""

    batch: int  # matches the answer to the work (a replaced worker's is ignored)
    items: tuple[Item, ...]


@dataclass(frozen=True)
class ScoredAhead:
    batch: int
    version: int  # the engine's weight version when scoring began
    outcomes: tuple[str, ...]  # each item's: accepted, spare (not scored) or a skip reason
    accepted: tuple[Item, ...]
    unscored: tuple[Item, ...]  # scoring raised: scored again when issued


@register_sampler("likelihood")
class LikelihoodSampler(GroupSampler):
    """The gate on the workers' side; the candidate budget, the bundles, the spares and
    the decisions made ahead on the pool's (see the module docstring)."""

    own_options = {
        "skip_all_wrong": (False, "only the likelihood gate predicts all-wrong groups"),
        "acceptance": ("skip", "only the likelihood gate accepts items at random"),
    }

    def __init__(
        self,
        gate: LikelihoodGate | None = None,
        budget: CandidateBudget | None = None,
        *,
        score_ahead: int = 0,
        draws: Draws = independent,
    ) -> None:
        super().__init__(draws)
        self.gate = gate  # the workers' side (None in the pool)
        self.budget = budget if budget is not None else CandidateBudget(64)
        self.score_ahead = score_ahead  # versions a decision made ahead stays usable; 0: off
        self._alternates: dict[int, tuple[Item, ...]] = {}  # each item's further candidates
        self._respared: set[int] = set()  # items that are spares drawn again
        self._forced: set[int] = set()  # items the gate is not to skip (selection/forced)
        self._issued_ahead: set[int] = set()  # items issued on a decision made ahead
        self._spares: deque[Item] = deque()  # handed back by the gate, drawn first
        self._returned: list[tuple[int, tuple[Item, ...]]] = []  # spares until the next publish
        self._ahead: deque[tuple[Item, int]] = deque()  # accepted ahead, at this version
        # the ScoreAhead out at each worker: (batch, items, fresh draws or a refresh)
        self._scoring: dict[int, tuple[int, tuple[Item, ...], bool]] = {}
        self._batches = 0  # ScoreAhead works handed out
        self._latest = self._merged = -1  # the trainer's last version, and the spares' merge

    @classmethod
    def build(cls, setup: SamplerSetup) -> LikelihoodSampler:
        sel = setup.selection
        gate = None
        if setup.sampling is not None:  # a worker's side
            gate = LikelihoodGate(
                setup.tokenizer,
                setup.sampling,
                setup.group_size,
                sel.threshold,
                sel.skip_all_wrong,
                sel.acceptance,
                sel.min_acceptance,
                setup.seed,
            )
        budget = CandidateBudget(sel.max_candidates, sel.max_skips_in_a_row)
        return cls(gate, budget, score_ahead=sel.score_ahead, draws=setup.draws)

    @classmethod
    def check(cls, run: SamplerContext) -> None:
        r = run.rollout
        if r.episode != "single_turn":
            raise ValueError(
                f"selection.kind=likelihood scores one reference completion per item, so it "
                f"needs rollout.episode=single_turn (got {r.episode!r})"
            )
        if r.ignore_eos:
            raise ValueError(
                "selection.kind=likelihood scores the reference answer up to its EOS, but "
                "rollout.ignore_eos=true samples past EOS, so the score would not bound the "
                "success rate; set rollout.ignore_eos=false or selection.kind=none"
            )
        if run.selection.acceptance == "importance" and not issubclass(
            algorithm_class(run.algorithm), PolicyGradient
        ):
            raise ValueError(
                "selection.acceptance=importance weights the advantages of a policy-gradient "
                f"update, but algorithm.name={run.algorithm} is not one"
            )
        if r.engine == "vllm" and not is_raw(r.temperature, r.top_k, r.top_p):
            raise ValueError(
                "selection.kind=likelihood with rollout.engine=vllm scores the reference with "
                "vLLM's prompt log-probs, which are raw: it needs rollout.temperature=1 (or 0), "
                f"top_k=0 and top_p=1, not temperature={r.temperature}, top_k={r.top_k}, "
                f"top_p={r.top_p}"
            )

    # ------------------------------------------------------------ the pool's side

    def attach(self, source: Source) -> None:
        super().attach(source)
        if source.max_staleness < 1:  # at η = 0 the decisions would depend on timing
            self.score_ahead = 0

    def issue(self, index: int) -> Item:
        """A decision made ahead first (generated as it is), then a spare (scored again,
        alone, without the weight of an earlier decision), then a fresh draw with its
        bundle, or forced through after too many skips in a row."""
        if self._ahead:
            self._issued_ahead.add(index)
            self.budget.count_ahead("issued")
            return self._ahead.popleft()[0]
        if self._spares:  # the gate accepted it last version: usually does again
            self._respared.add(index)
            return weighted(self._spares.popleft(), None)
        item = self.source.draw()
        if self.budget.force_next():
            self._forced.add(index)
        elif self.budget.size > 1:
            more = self.budget.size - 1
            self._alternates[index] = tuple(self.source.draw() for _ in range(more))
        return item

    def plan(self, index: int) -> Bundle | None:
        if index in self._forced or index in self._issued_ahead:
            return UNGATED
        alternates = self._alternates.get(index)
        return Bundle(alternates) if alternates else None

    def finished(self, item: Item, report: Report) -> None:
        """The item's counters, and its spares kept for the next publish."""
        index = report.item_index
        self._alternates.pop(index, None)
        self._forced.discard(index)
        if index in self._issued_ahead:
            self._issued_ahead.discard(index)
            if isinstance(report, GroupRejected) and report.reason == EQUAL_REWARDS:
                self.budget.count_ahead("dropped")
        respared = int(index in self._respared)
        self._respared.discard(index)
        feedback = report.feedback if report.feedback is not None else GateFeedback()
        self.budget.observe(feedback.outcomes, respared)
        if feedback.spares:
            self._returned.append((index, feedback.spares))

    def published(self, version: int, outstanding: set[int]) -> None:
        self._latest = version  # the pump merges the spares before it admits at it

    def catch_up(self) -> None:
        """After a publish: the spares handed back since the last one join the draw queue,
        in item order, decisions made ahead that are too old become spares, and the
        bundle size moves."""
        if self._merged == self._latest:
            return
        self._merged = self._latest
        self._spares.extend(self._returned_items())
        self._returned.clear()
        while self._ahead and self._ahead[0][1] < self._latest - self.score_ahead:
            self._spares.append(self._ahead.popleft()[0])  # too old: scored again when issued
            self.budget.count_ahead("expired")
        self.budget.advance()

    def _returned_items(self) -> list[Item]:
        return [it for _, items in sorted(self._returned, key=lambda r: r[0]) for it in items]

    def idle_work(self, worker: int, version: int) -> ScoreAhead | None:
        """Fresh candidates to score ahead, until enough are accepted for ``score_ahead``
        batches; then the oldest decisions again, at the worker's newer weights."""
        if not self.score_ahead or worker in self._scoring:
            return None
        want = self.score_ahead * self.source.items_per_batch - len(self._ahead)
        if want > 0:
            accept_rate = max(0.1, 1.0 - self.budget.skip_rate)
            n = min(AHEAD_CHUNK, math.ceil(want / accept_rate))
            items, fresh = tuple(self.source.draw() for _ in range(n)), True
        else:
            old: list[Item] = []
            while self._ahead and self._ahead[0][1] < version and len(old) < AHEAD_CHUNK:
                old.append(self._ahead.popleft()[0])
            if not old:
                return None
            items, fresh = tuple(old), False
        self._batches += 1
        self._scoring[worker] = (self._batches, items, fresh)
        return ScoreAhead(self._batches, items)

    def work_done(self, worker: int, result: ScoredAhead) -> None:
        sent = self._scoring.get(worker)
        if sent is None or sent[0] != result.batch:
            return  # from a worker replaced since: its candidates are spares already
        del self._scoring[worker]
        self.budget.observe(result.outcomes, ahead="scored" if sent[2] else "rescored")
        self._ahead.extend((item, result.version) for item in result.accepted)
        self._spares.extend(result.unscored)

    def worker_lost(self, worker: int) -> None:
        sent = self._scoring.pop(worker, None)
        if sent is not None:  # its candidates scored ahead: not lost
            self._spares.extend(sent[1])

    def state_dict(self, outstanding: set[int]) -> dict[str, Any]:
        """The budget, the bundles of the outstanding items, and every candidate drawn and
        not issued: spares, those handed back since the last publish, and those accepted
        (or being scored) ahead."""
        keep = outstanding
        self._alternates = {i: a for i, a in self._alternates.items() if i in keep}
        self._respared &= keep
        self._forced &= keep
        self._issued_ahead &= keep
        held = [item for item, _ in self._ahead]
        held += [it for sent in self._scoring.values() for it in sent[1]]
        return copy.deepcopy(
            {
                "budget": self.budget.state_dict(),
                "alternates": self._alternates,
                "respared": sorted(self._respared),
                "forced": sorted(self._forced),
                "issued_ahead": sorted(self._issued_ahead),
                "spares": [*self._spares, *self._returned_items(), *held],
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.budget.load_state_dict(state["budget"])
        self._alternates = dict(state["alternates"])
        self._respared = set(state["respared"])
        self._forced = set(state["forced"])
        self._issued_ahead = set(state.get("issued_ahead", ()))
        self._spares = deque(state["spares"])

    def metrics(self) -> dict[str, float]:
        return self.budget.metrics()

    # ------------------------------------------------------------ the worker's side

    async def rollout(
        self, engine: InferenceEngine, item: Item, plan: Bundle | None, roll: Roll
    ) -> Report | None:
        """Scores the item and its alternates at once and rolls out the first the gate
        accepts, as ``item.index`` (an ungated item as it is)."""
        if plan is not None and not plan.gated:
            return await roll(item)
        alternates = plan.alternates if plan is not None else ()
        try:
            choice = await self._gate().choose(engine, item.index, [item, *alternates])
        except asyncio.CancelledError:
            return None
        told = GateFeedback(tuple(choice.outcomes), tuple(choice.spares))
        if choice.error is not None:  # a scoring failure is recorded, like an episode's
            failed = failed_report(item.index, "selection_error", choice.error)
            return dataclasses.replace(failed, feedback=told)
        if choice.item is None:
            return GroupRejected(
                item.index, "filtered", choice.reason, choice.detail, feedback=told
            )
        report = await roll(choice.item)
        return None if report is None else dataclasses.replace(report, feedback=told)

    async def work(self, engine: InferenceEngine, payload: ScoreAhead) -> ScoredAhead:
        version = engine.version
        scored = await self._gate().score_ahead(engine, list(payload.items))
        outcomes, accepted, unscored = (tuple(x) for x in scored)
        return ScoredAhead(payload.batch, version, outcomes, accepted, unscored)

    def _gate(self) -> LikelihoodGate:
        if self.gate is None:
            raise TypeError("a likelihood sampler built without a tokenizer has no gate")
        return self.gate

"""Prompt selection by the policy's own likelihood (``selection.kind=likelihood``).

A per-prompt posterior (:mod:`streamrl.rollout.selection.posterior`) can only act on prompts it has
seen, and on the main job about 80% of the draws are first draws. This gate needs no
history: right before a group is generated, the rollout worker asks its engine, at the
weights it is about to sample with, for the probability of the item's reference answer
(the SFT demonstration: answer + EOS), teacher-forced under the run's sampling
distribution. Scoring it costs far less than the group it may save (below).

    p_hat = P(the policy samples exactly the reference)
    P_hat(all correct) = p_hat^G

``p_hat`` is a lower bound on the success rate (other completions may also be graded
right: "46." or a sentence ending in 46), so ``p_hat^G`` is a lower bound on the chance the
group is all correct, and the gate never skips on a small ``p_hat``: a policy that answers
in another format than the reference would otherwise look all-wrong. The item is skipped
when P_hat(all correct) > ``threshold``. The decision is a pure function of the weights
and the item: at η = 0 two runs, or a run and its resume, make the same decisions
(``tests/integration/test_resume.py``). Their weights agree only up to float rounding, as with
dynamic sampling: a chosen candidate's samples reach the engine a few event-loop turns
after its scoring step, so which engine step first batches them depends on timing. A
skipped candidate is never generated and is counted in ``selection/skipped/<reason>``;
an issued item whose candidates are all skipped is reported as ``filtered:
predicted_all_correct`` (or ``_wrong``), so the books still balance. A policy that has
mastered every prompt makes the gate skip candidate after candidate, as dynamic sampling
would generate and drop them, only cheaper.

With ``selection.skip_all_wrong`` the gate also skips an item when (1 - p_hat)^G exceeds
the threshold (reason ``predicted_all_wrong``). Since p_hat is a lower bound on the
success rate, that over-states P(all wrong); it suits tasks whose reference is the one
accepted form of the answer, as on the main job.

Importance acceptance (``selection.acceptance=importance``). Skipping every item above
the threshold changes what the update sees: the mixed groups of easy prompts (p ~ 0.8
to 0.95), which sharpen the sampled policy, are never generated. Instead an item is
generated with probability a(P_hat(all equal)) (:func:`acceptance_probability`: 1 up to
the threshold, falling as sqrt((1-q)/q) above it, never below ``min_acceptance``), and
its samples carry the weight 1/a, by which the policy-gradient update scales their
advantages (normalised to mean 1 over the batch). The update then sees, in expectation,
the groups it would see without selection, and only the generation of the likely
all-equal groups is thinned. The draw is a pure function of (seed, item, weight version).

Candidates. At a high skip rate, one candidate per issued item makes a chain: score,
skip, report, get the next item, score... one engine step and a round trip through the
stream per link, and late in the main job 90% of items are skipped, so a slot needed
~15 links while the trainer waited. So the rollout pool hands each issued item a bundle
of candidates drawn from the task source (:class:`CandidateBudget` sizes it from the
recent skip rate), the worker scores them all in one engine step (:meth:`LikelihoodGate.
choose`) and generates the first one the gate accepts. Candidates before it are skipped
(counted), later ones that were skipped are dropped (counted), and later ones that were
accepted or failed go back to the pool as *spares*, issued again (and scored again, alone:
the gate accepted them a version ago) before any fresh draw, from the next weight version
on. So nothing drawn is lost, every decision is still a pure function of (weights, item),
and at η = 0 which candidates an item gets does not depend on timing (spares re-enter
only at a publish, in item order).

Scoring ahead (``selection.score_ahead``, at η >= 1). Late in a run most candidates
are skipped, so the scoring is the cost, and it lands on the engine when it is busiest.
But a worker is idle whenever it is ahead of the trainer: the stream admits nothing more
until the trainer consumes. Then the pool sends it fresh candidates to score ahead
(:meth:`LikelihoodGate.score_ahead`); the accepted ones are held in draw order and issued
before anything else, alone, and generated without scoring again, while their decision
is at most ``score_ahead`` weight versions old (older ones become spares, scored again).
Skipped ones are counted like any skip. Not during evaluations (:meth:`RolloutPool.work_ahead`),
and not at η = 0, where what an idle worker gets to score would depend on timing.

What it costs. The engine scores a forced continuation in the step that admits it (the
prompt and the reference in one prefill, ``LocalEngine``), usually a step that decodes
other groups anyway, so a scored candidate costs a prefill row of prompt + reference and
the worker's bookkeeping, not a decode step per reference token. It does not help when the
policy reasons before answering: the probability of the bare reference right after the
prompt is then tiny, and nothing is skipped (safe, and useless). Measured on the main job:
``benchmarks/results/selection.md``.

``benchmarks/bench_selection_bound.py`` measures how good ``p_hat`` is against the
outcomes of fresh groups (correlation ~0.8-0.9 with the prompt's success rate, better
than 32 earlier samples of the same prompt) and how much any such rule can save.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from streamrl.core.engine import InferenceEngine
from streamrl.core.types import WEIGHT_KEY, GenerationRequest, Item, SamplingParams
from streamrl.models import encode_prompt, reference_ids


@dataclass
class LikelihoodGate:
    """Decides, per item, whether to generate its group (see the module docstring)."""

    tokenizer: Any
    sampling: SamplingParams
    group_size: int
    threshold: float
    skip_all_wrong: bool = False
    acceptance: str = "skip"  # or "importance" (see the module docstring)
    min_acceptance: float = 0.1
    seed: int = 0

    async def p_reference(self, engine: InferenceEngine, item: Item) -> float | None:
        """p_hat, the policy's probability of sampling the reference, or None when the item
        cannot be scored: it has no reference answer, or the reference does not fit its
        answer budget."""
        if item.answer is None:
            return None
        target = reference_ids(self.tokenizer, item.answer)
        budget = int(item.metadata.get("max_new_tokens", self.sampling.max_new_tokens))
        if not target or len(target) > budget:
            return None
        params = replace(self.sampling, max_new_tokens=len(target), stop=[], stop_token_ids=[])
        request = GenerationRequest(encode_prompt(self.tokenizer, item), params, 0, target)
        result = await engine.agenerate(request)
        if result.token_ids != target[: len(result.token_ids)]:
            raise RuntimeError(
                f"the inference engine {type(engine).__name__} ignored forced_ids (it sampled "
                "instead of scoring the reference), so selection.kind=likelihood cannot use it"
            )
        if len(result.logprobs) < len(target):  # cut by the engine's max_seq_len
            return None
        return math.exp(sum(result.logprobs))

    async def p_all_correct(self, engine: InferenceEngine, item: Item) -> float | None:
        """P_hat(all G samples correct) = p_hat^G (None: not scored, see p_reference)."""
        p = await self.p_reference(engine, item)
        return None if p is None else p**self.group_size

    async def skip(
        self, engine: InferenceEngine, item: Item, version: int = 0
    ) -> tuple[str, float] | float | None:
        """Why the item is to be skipped and the predicted probability: ('correct',
        p_hat^G) or, with ``skip_all_wrong``, ('wrong', (1-p_hat)^G); else the accepted
        item's importance weight (``acceptance=importance``), or None (accepted, unscored
        or ``acceptance=skip``). ``version`` seeds the draw of an importance acceptance."""
        p = await self.p_reference(engine, item)
        if p is None:
            return None
        right, wrong = p**self.group_size, (1.0 - p) ** self.group_size
        wrong = wrong if self.skip_all_wrong else 0.0
        side, likely = ("correct", right) if right >= wrong else ("wrong", wrong)
        if self.acceptance == "skip":
            return (side, likely) if likely > self.threshold else None
        accept = acceptance_probability(right + wrong, self.threshold, self.min_acceptance)
        if accept >= 1.0:
            return 1.0
        if uniform(self.seed, item.id, version) < accept:
            return 1.0 / accept
        return side, likely

    async def decide(
        self, engine: InferenceEngine, candidates: list[Item]
    ) -> list[tuple[str, float] | float | BaseException | None]:
        """:meth:`skip` for every candidate at once (one engine step), in order: a skip
        reason, None or a weight (accepted) or the error its scoring raised."""
        version = engine.version if self.acceptance == "importance" else 0
        results = await asyncio.gather(
            *(self.skip(engine, c, version) for c in candidates), return_exceptions=True
        )
        if any(isinstance(r, asyncio.CancelledError) for r in results):
            raise asyncio.CancelledError
        return results

    async def choose(self, engine: InferenceEngine, index: int, candidates: list[Item]) -> Choice:
        """Scores every candidate at once (one engine step) and picks, in order, the first
        the gate accepts, as item ``index`` (see the module docstring)."""
        results = await self.decide(engine, candidates)
        choice = Choice()
        for candidate, result in zip(candidates, results, strict=True):
            decided = choice.item is not None or choice.error is not None
            if isinstance(result, tuple):  # skipped, wherever it stands
                side, p = result
                choice.outcomes.append(f"predicted_all_{side}")
                if not decided:
                    bound = f">= {p:.4f}" if side == "correct" else f"<= {p:.4f}"
                    choice.detail = f"predicted P(all {self.group_size} {side}) {bound}"
            elif decided:  # accepted (or failed) after the choice: back to the pool
                choice.outcomes.append("spare")
                choice.spares.append(weighted(candidate, None))  # decided again when issued
            elif isinstance(result, BaseException):  # the item fails with its scoring error
                choice.outcomes.append("failed")
                choice.error = result
            else:
                choice.outcomes.append("chosen")
                choice.item = weighted(replace(candidate, index=index), result)
        if choice.item is None and choice.error is None and len(candidates) > 1:
            choice.detail = f"all {len(candidates)} candidates skipped; the last: {choice.detail}"
        return choice

    async def score_ahead(
        self, engine: InferenceEngine, candidates: list[Item]
    ) -> tuple[list[str], list[Item], list[Item]]:
        """Decides for candidates before any is issued (``selection.score_ahead``): each
        one's outcome (``accepted``, ``spare`` or a skip reason), the accepted ones, and
        those whose scoring failed, handed back like spares (scored again when issued,
        where a failure ends the item and is recorded)."""
        results = await self.decide(engine, candidates)
        outcomes: list[str] = []
        accepted: list[Item] = []
        unscored: list[Item] = []
        for candidate, result in zip(candidates, results, strict=True):
            if isinstance(result, tuple):
                outcomes.append(f"predicted_all_{result[0]}")
            elif isinstance(result, BaseException):
                outcomes.append("spare")
                unscored.append(weighted(candidate, None))
            else:
                outcomes.append("accepted")
                accepted.append(weighted(candidate, result))
        return outcomes, accepted, unscored


def weighted(item: Item, weight: float | None) -> Item:
    """``item`` carrying its importance weight (``acceptance=importance``): the rollout
    copies it into its samples' metadata, the policy-gradient update scales their
    advantages by it. None (``acceptance=skip``, or not scored): ``item`` unweighted."""
    metadata = {k: v for k, v in item.metadata.items() if k != WEIGHT_KEY}
    if weight is not None:
        metadata[WEIGHT_KEY] = weight
    elif WEIGHT_KEY not in item.metadata:
        return item
    return replace(item, metadata=metadata)


def acceptance_probability(p_equal: float, threshold: float, floor: float) -> float:
    """``acceptance=importance``: the chance an item whose group is predicted all-equal
    with probability ``p_equal`` is generated.

    Generating it costs one group, dropped with probability q = ``p_equal``; kept, its
    weight 1/a makes the update's expectation that of no selection. Accepting with
    a = kappa * sqrt((1-q)/q) minimises the weighted gradient's variance for a given
    expected number of drops (a Lagrangian in a; ``benchmarks/results/selection.md``).
    kappa is set so that a = 1 at q = ``threshold`` (below it every item is generated),
    and a never falls below ``floor``, so a weight is at most 1/floor.

    >>> [round(acceptance_probability(q, 0.2, 0.1), 4) for q in (0.1, 0.2, 0.5, 0.8, 0.99)]
    [1.0, 1.0, 0.5, 0.25, 0.1]
    """
    if p_equal <= threshold:
        return 1.0
    a = math.sqrt(threshold / (1.0 - threshold) * (1.0 - p_equal) / p_equal)
    return max(floor, min(1.0, a))


def uniform(seed: int, item_id: str, version: int) -> float:
    """A uniform draw in [0, 1) that is a pure function of (run seed, item, weight
    version): the gate's decisions stay reproducible at η = 0 and across a resume."""
    digest = hashlib.blake2b(f"{seed}:{version}:{item_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass
class Choice:
    """What :meth:`LikelihoodGate.choose` made of an item's candidates: the one to generate
    (None: every candidate up to the first failure was skipped), the scoring failure that
    ends the item instead, each candidate's outcome in order (``chosen``, ``failed``,
    ``spare`` or the skip reason ``predicted_all_correct`` / ``predicted_all_wrong``), the
    candidates to hand back to the pool, and the last skip's explanation."""

    item: Item | None = None
    error: BaseException | None = None
    outcomes: list[str] = field(default_factory=list)
    spares: list[Item] = field(default_factory=list)
    detail: str = ""

    @property
    def reason(self) -> str:
        """The reason an item none of whose candidates was chosen is filtered for."""
        return next((o for o in reversed(self.outcomes) if o.startswith("predicted")), "")


# the chance, at the recent skip rate, that every candidate of an item is skipped
MISS_PROBABILITY = 0.1


def candidates_for(skip_rate: float, cap: int) -> int:
    """How many candidates an item gets so that all are skipped with probability at most
    ``MISS_PROBABILITY``, if each is skipped independently at ``skip_rate``: the least k
    with skip_rate^k <= MISS_PROBABILITY, at most ``cap``.

    >>> [candidates_for(r, 64) for r in (0.0, 0.1, 0.3, 0.5, 0.9, 0.93, 1.0)]
    [1, 1, 2, 4, 22, 32, 64]
    """
    if skip_rate <= MISS_PROBABILITY:
        return 1
    if skip_rate >= 1.0:
        return cap
    k = math.ceil(math.log(MISS_PROBABILITY) / math.log(skip_rate) - 1e-9)
    return max(1, min(cap, k))


class CandidateBudget:
    """The rollout pool's side of the gate: how many candidates each issued item gets and
    the ``selection/*`` counters of what the workers made of them (thread-safe).

    Reports are taken as they arrive (``observe``); the skip rate behind the bundle size
    moves only at :meth:`advance`, when the trainer publishes weights, to the share of
    fresh candidates skipped since the previous publish. At η = 0 every item issued at a version
    has ended before the next publish, so the sizes do not depend on timing.
    """

    def __init__(self, max_candidates: int, max_skips_in_a_row: int = 100) -> None:
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.max_candidates, self.max_skips_in_a_row = max_candidates, max_skips_in_a_row
        self.in_a_row = self.forced = 0  # candidates skipped since one was generated
        self.skip_rate = 0.0  # of fresh candidates, scored between the last two publishes
        self.size = 1
        self.scored = self.spares = self.spares_reskipped = 0
        self.skipped: Counter[str] = Counter()
        self.ahead: Counter[str] = Counter()  # score-ahead: scored, issued, expired, dropped
        self._window = [0, 0]  # candidates scored, skipped since the last advance
        self._lock = threading.Lock()

    def observe(
        self, outcomes: list[str] | tuple[str, ...], respared: int = 0, ahead: str = ""
    ) -> None:
        """An item ended; ``outcomes`` says what became of each of its candidates (see
        :class:`Choice`), the first ``respared`` of which were spares drawn again. The skip
        rate counts only the fresh ones: a spare was accepted before and mostly is again,
        so it says little about how often a new draw is skipped. ``ahead``: candidates
        scored ahead instead (:meth:`LikelihoodGate.score_ahead`), ``scored`` (fresh draws)
        or ``rescored`` (decisions made ahead, made again at newer weights)."""
        with self._lock:
            self.scored += len(outcomes)
            if ahead:
                self.ahead[ahead] += len(outcomes)
                respared = len(outcomes) if ahead == "rescored" else 0
            self.spares += outcomes.count("spare")
            skips = [o for o in outcomes if o.startswith("predicted")]
            self.skipped.update(skips)
            reskipped = sum(o.startswith("predicted") for o in outcomes[:respared])
            if ahead == "rescored":
                self.ahead["reskipped"] += reskipped
            elif not ahead:
                self.spares_reskipped += reskipped
            fresh = outcomes[respared:]
            self._window[0] += len(fresh)
            self._window[1] += sum(o.startswith("predicted") for o in fresh)
            generated = "chosen" in outcomes or "accepted" in outcomes
            self.in_a_row = 0 if generated else self.in_a_row + len(skips)

    def count_ahead(self, event: str, n: int = 1) -> None:
        """A score-ahead event: ``issued`` on an earlier decision, ``expired`` (too old,
        scored again when issued) or ``dropped`` (issued ahead, then filtered by the
        algorithm: how often a decision made ahead was wrong)."""
        with self._lock:
            self.ahead[event] += n

    def force_next(self) -> bool:
        """Whether the next item is to be generated without the gate: more than
        ``max_skips_in_a_row`` candidates were skipped since any was generated, so that a
        gate that skips everything (a mastered task, or ``skip_all_wrong`` on a policy
        that answers in another format) cannot stall the run. Counted in
        ``selection/forced``. The count follows the order reports arrive in, so which
        item is forced can differ between two η = 0 runs (only where one is forced)."""
        with self._lock:
            if self.in_a_row < self.max_skips_in_a_row:
                return False
            self.in_a_row, self.forced = 0, self.forced + 1
            return True

    def advance(self) -> None:
        with self._lock:
            scored, skipped = self._window
            if scored:
                self.skip_rate = skipped / scored
                self.size = candidates_for(self.skip_rate, self.max_candidates)
            self._window = [0, 0]

    def metrics(self) -> dict[str, float]:
        """``selection/scored`` candidates, ``selection/skipped`` (also by reason),
        ``selection/spares`` handed back and ``selection/spares_reskipped`` (skipped when
        drawn again), ``selection/forced`` items generated without the gate (see
        :meth:`force_next`), and the current ``selection/skip_rate`` of fresh candidates
        and ``selection/candidates`` per issued item; with ``selection.score_ahead``,
        ``selection/ahead/{scored,rescored,reskipped,issued,expired,dropped}`` (see
        :meth:`observe` and :meth:`count_ahead`)."""
        with self._lock:
            out = {
                "selection/scored": float(self.scored),
                "selection/skipped": float(sum(self.skipped.values())),
                "selection/spares": float(self.spares),
                "selection/spares_reskipped": float(self.spares_reskipped),
                "selection/forced": float(self.forced),
                "selection/skip_rate": self.skip_rate,
                "selection/candidates": float(self.size),
            }
            out.update({f"selection/skipped/{k}": float(v) for k, v in self.skipped.items()})
            out.update({f"selection/ahead/{k}": float(v) for k, v in self.ahead.items()})
            return out

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "skip_rate": self.skip_rate,
                "size": self.size,
                "counters": [self.scored, self.spares, self.spares_reskipped, dict(self.skipped)],
                "forced": [self.in_a_row, self.forced],
                "window": list(self._window),
                "ahead": dict(self.ahead),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.skip_rate, self.size = state["skip_rate"], state["size"]
            self.scored, self.spares, self.spares_reskipped, skipped = state["counters"]
            self.skipped = Counter(skipped)
            self._window = list(state["window"])
            self.in_a_row, self.forced = state["forced"]
            self.ahead = Counter(state.get("ahead", {}))


def build_gate(cfg: Any, tokenizer: Any, sampling: SamplingParams) -> LikelihoodGate | None:
    """The run's likelihood gate (None unless ``selection.kind=likelihood``)."""
    if cfg.selection.kind != "likelihood":
        return None
    sel = cfg.selection
    return LikelihoodGate(
        tokenizer,
        sampling,
        cfg.rollout.group_size,
        sel.threshold,
        sel.skip_all_wrong,
        sel.acceptance,
        sel.min_acceptance,
        cfg.seed,
    )


def build_candidate_budget(cfg: Any) -> CandidateBudget | None:
    """The pool's candidate budget (None unless ``selection.kind=likelihood``)."""
    if cfg.selection.kind != "likelihood":
        return None
    return CandidateBudget(cfg.selection.max_candidates, cfg.selection.max_skips_in_a_row)

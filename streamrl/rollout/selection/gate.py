"""The likelihood gate: prompt selection by the policy's own likelihood.

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

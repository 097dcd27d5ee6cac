"""Prompt selection by the policy's own likelihood (``selection.kind=likelihood``).

A per-prompt posterior (:mod:`streamrl.data.selection`) can only act on prompts it has
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
and the item, so η = 0 stays bit-exact and a resumed run decides exactly as before. A
skipped item is reported as ``filtered: predicted_all_correct`` (never generated), so
the books still balance; a policy that has mastered every prompt makes the pool score
and skip item after item, as dynamic sampling would generate and drop them, only cheaper.

With ``selection.skip_all_wrong`` the gate also skips an item when (1 - p_hat)^G exceeds
the threshold (``filtered: predicted_all_wrong``). Since p_hat is a lower bound on the
success rate, that over-states P(all wrong); it suits tasks whose reference is the one
accepted form of the answer, as on the main job.

What it costs. The engine scores a forced continuation in the step that admits it (the
prompt and the reference in one prefill, ``LocalEngine``), usually a step that decodes
other groups anyway, so a scored item costs a prefill row of prompt + reference and the
worker's bookkeeping, not a decode step per reference token. It does not help when the
policy reasons before answering: the probability of the bare reference right after the
prompt is then tiny, and nothing is skipped (safe, and useless). On the main job, a
threshold of 0.2 with ``skip_all_wrong`` removes half to two thirds of the dropped groups
at equal accuracy, but RL takes ~10% longer: the run is trainer-bound, and each skip is a
round trip through the stream (``benchmarks/results/selection.md``).

``benchmarks/bench_selection_bound.py`` measures how good ``p_hat`` is against the
outcomes of fresh groups (correlation ~0.8-0.9 with the prompt's success rate, better
than 32 earlier samples of the same prompt) and how much any such rule can save.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from streamrl.engines.base import InferenceEngine
from streamrl.models import encode_prompt, reference_ids
from streamrl.types import GenerationRequest, Item, SamplingParams


@dataclass
class LikelihoodGate:
    """Decides, per item, whether to generate its group (see the module docstring)."""

    tokenizer: Any
    sampling: SamplingParams
    group_size: int
    threshold: float
    skip_all_wrong: bool = False

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

    async def skip(self, engine: InferenceEngine, item: Item) -> tuple[str, float] | None:
        """Why the item is to be skipped and the predicted probability, else None (issue
        it): ('correct', p_hat^G) or, with ``skip_all_wrong``, ('wrong', (1-p_hat)^G)."""
        p = await self.p_reference(engine, item)
        if p is None:
            return None
        right, wrong = p**self.group_size, (1.0 - p) ** self.group_size
        if right > self.threshold:
            return "correct", right
        if self.skip_all_wrong and wrong > self.threshold:
            return "wrong", wrong
        return None


def build_gate(cfg: Any, tokenizer: Any, sampling: SamplingParams) -> LikelihoodGate | None:
    """The run's likelihood gate (None unless ``selection.kind=likelihood``)."""
    if cfg.selection.kind != "likelihood":
        return None
    sel = cfg.selection
    return LikelihoodGate(
        tokenizer, sampling, cfg.rollout.group_size, sel.threshold, sel.skip_all_wrong
    )

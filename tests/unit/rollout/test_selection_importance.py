"""selection.acceptance=importance: the likelihood gate generates a likely all-equal item
with probability a (against hand-computed values) and weights its samples by 1/a, so the
weighted count of generated items is, in expectation, the count drawn; the update scales
the advantages by the normalised weights; the draws are a pure function of (seed, item,
version); a decision made ahead loses its weight when it expires."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from streamrl.config import load_config
from streamrl.core.timing import StageTimer
from streamrl.core.types import (
    WEIGHT_KEY,
    GenerationRequest,
    GenerationResult,
    Item,
    SamplingParams,
    Trajectory,
)
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.selection.gate import LikelihoodGate, acceptance_probability, weighted
from streamrl.rollout.selection.likelihood import LikelihoodSampler
from streamrl.run.preflight import PreflightError, check_selection
from streamrl.stream.backends import RolloutPool
from streamrl.stream.sample_stream import Group, SampleStream
from tests.tiny_run import algorithm_of
from tests.unit.rollout.test_selection import ScriptedBackend


def test_the_acceptance_probability_against_hand_computed_values() -> None:
    # kappa^2 = t / (1 - t) = 0.25 at t = 0.2, so a = 0.5 * sqrt((1 - q) / q)
    assert acceptance_probability(0.2, 0.2, 0.1) == 1.0  # at the threshold: always
    assert acceptance_probability(0.05, 0.2, 0.1) == 1.0
    assert acceptance_probability(0.5, 0.2, 0.1) == pytest.approx(0.5)
    assert acceptance_probability(0.8, 0.2, 0.1) == pytest.approx(0.25)
    assert acceptance_probability(0.9, 0.2, 0.1) == pytest.approx(0.5 / 3)
    assert acceptance_probability(0.99, 0.2, 0.1) == 0.1  # the floor
    assert acceptance_probability(0.99, 0.2, 0.01) == pytest.approx(0.5 * math.sqrt(1 / 99))
    # t = 0.5: kappa = 1, a = sqrt((1 - q) / q)
    assert acceptance_probability(0.64, 0.5, 0.1) == pytest.approx(0.75)


class _Scores:
    """Scores every reference token at a fixed log-prob, at weight version ``version``."""

    def __init__(self, logprob: float, version: int = 3) -> None:
        self.logprob, self.version = logprob, version

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        n = len(request.forced_ids)
        return GenerationResult(
            request.prompt_ids, request.forced_ids, [self.logprob] * n, [0] * n, "length"
        )


def _gate(acceptance: str, seed: int = 0, skip_all_wrong: bool = False) -> LikelihoodGate:
    _, tok = load_model_and_tokenizer("tiny", seed=0)
    sampling = SamplingParams(6, 1.0, stop_token_ids=[2])
    return LikelihoodGate(tok, sampling, 4, 0.2, skip_all_wrong, acceptance, 0.1, seed)


def _items(n: int) -> list[Item]:
    return [Item(id=f"q{i}", prompt="1+2=", answer="3") for i in range(n)]


def test_a_likely_all_equal_item_is_generated_with_probability_a_and_weighted_1_over_a() -> None:
    gate = _gate("importance")
    items = _items(2000)
    # "3" + EOS at -0.05 each: p_hat = e^-0.1, q = p_hat^4 = e^-0.4 = 0.6703
    q = math.exp(-0.4)
    a = 0.5 * math.sqrt((1 - q) / q)  # 0.3507
    results = asyncio.run(gate.decide(_Scores(-0.05), items))
    weights = [r for r in results if isinstance(r, float)]
    skipped = [r for r in results if isinstance(r, tuple)]
    assert len(weights) + len(skipped) == len(items)
    assert all(w == pytest.approx(1 / a) for w in weights)
    assert all(s == ("correct", pytest.approx(q)) for s in skipped)
    # 2,000 draws at a = 0.35: the binomial's standard deviation is 0.011
    assert len(weights) / len(items) == pytest.approx(a, abs=0.04)
    # unbiased: the weighted count of generated items is the count drawn
    assert sum(weights) == pytest.approx(len(items), rel=0.12)
    # a pure function of (seed, item, version): the same again, other draws elsewhere
    assert asyncio.run(gate.decide(_Scores(-0.05), items)) == results
    assert asyncio.run(gate.decide(_Scores(-0.05, version=4), items)) != results
    assert asyncio.run(_gate("importance", seed=1).decide(_Scores(-0.05), items)) != results
    # below the threshold every item is generated, at weight 1: e^-2 ^ 4 = 0.0003
    assert asyncio.run(gate.decide(_Scores(-1.0), items[:50])) == [1.0] * 50
    # skip: the same scores, every item skipped, accepted ones unweighted
    assert asyncio.run(_gate("skip").decide(_Scores(-0.05), items[:50])) == skipped[:1] * 50
    assert asyncio.run(_gate("skip").decide(_Scores(-1.0), items[:50])) == [None] * 50


def test_all_wrong_and_all_correct_add_up_and_the_chosen_item_carries_its_weight() -> None:
    gate = _gate("importance", skip_all_wrong=True)
    # "3" + EOS at -0.5 each: p_hat = e^-1 = 0.368, q = p^4 + (1-p)^4 = 0.018 + 0.160:
    # below 0.2, so always generated
    p = math.exp(-1.0)
    assert p**4 + (1 - p) ** 4 == pytest.approx(0.1780, abs=1e-4)
    assert asyncio.run(gate.decide(_Scores(-0.5), _items(20))) == [1.0] * 20
    # at -2.0 each: p_hat = e^-4, q = (1 - e^-4)^4 + e^-16 = 0.9287 (mostly all wrong)
    p = math.exp(-4.0)
    q = p**4 + (1 - p) ** 4
    a = 0.5 * math.sqrt((1 - q) / q)
    assert a == pytest.approx(0.1385, abs=1e-4)
    results = asyncio.run(gate.decide(_Scores(-2.0), _items(400)))
    assert {r[0] for r in results if isinstance(r, tuple)} == {"wrong"}
    assert {round(r, 6) for r in results if isinstance(r, float)} == {round(1 / a, 6)}
    choice = asyncio.run(gate.choose(_Scores(-2.0), 9, _items(400)))
    assert choice.item is not None and choice.item.index == 9
    assert choice.item.metadata[WEIGHT_KEY] == pytest.approx(1 / a)
    assert choice.outcomes.count("chosen") == 1
    assert choice.outcomes.count("spare") == len(choice.spares) > 0
    assert all(WEIGHT_KEY not in s.metadata for s in choice.spares)  # scored again later


def test_weighted_items_and_a_decision_that_expires() -> None:
    item = Item(id="x", prompt="1+1=", answer="2", metadata={"operands": [1, 1]})
    assert weighted(item, None) is item
    heavy = weighted(item, 2.5)
    assert heavy.metadata == {"operands": [1, 1], WEIGHT_KEY: 2.5} and item.metadata == {
        "operands": [1, 1]
    }
    assert weighted(heavy, None).metadata == item.metadata  # scored again: no stale weight
    assert weighted(heavy, 4.0).metadata[WEIGHT_KEY] == 4.0
    # a held decision scored again: a new weight, or none where the scoring failed
    gate = _gate("importance")
    held = [weighted(Item(id=f"h{i}", prompt="1+2=", answer="3"), 9.0) for i in range(40)]
    _, accepted, unscored = asyncio.run(gate.score_ahead(_Scores(-0.05), held))
    q = math.exp(-0.4)
    assert accepted and all(
        it.metadata[WEIGHT_KEY] == pytest.approx(2 / math.sqrt((1 - q) / q)) for it in accepted
    )
    _, accepted, unscored = asyncio.run(gate.score_ahead(_Broken(), held))
    assert not accepted and len(unscored) == 40
    assert all(WEIGHT_KEY not in it.metadata for it in unscored)


class _Broken(_Scores):
    def __init__(self) -> None:
        super().__init__(0.0)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        raise RuntimeError("engine broke")


def _traj(reward: float, item: int, weight: float | None) -> Trajectory:
    return Trajectory(
        input_ids=torch.arange(1, 5),
        loss_mask=torch.tensor([False, False, True, True]),
        behavior_logprobs=torch.tensor([0.0, 0.0, -1.0, -1.0]),
        versions=torch.tensor([-1, -1, 0, 0]),
        reward=reward,
        item_index=item,
        metadata={} if weight is None else {WEIGHT_KEY: weight},
    )


def test_the_update_scales_the_advantages_by_the_normalised_weights() -> None:
    model, tok = load_model_and_tokenizer("tiny-small", seed=0)
    trainer = TrainEngine(model, micro_batch_sequences=4)
    algo = algorithm_of(load_config(None, ["algorithm.dynamic_sampling=false"]))
    algo.setup(trainer, tok)
    groups = [
        Group(0, 0, [_traj(1.0, 0, 1.0), _traj(0.0, 0, 1.0)]),  # accepted for sure
        Group(1, 0, [_traj(1.0, 1, 3.0), _traj(0.0, 1, 3.0)]),  # accepted at a = 1/3
    ]
    batch = algo.prepare(groups, trainer, StageTimer())
    # GRPO: +-1/sqrt(2) in each group; the weights 1 and 3 normalise to 0.5 and 1.5
    a = 2**-0.5
    want = torch.tensor([0.5 * a, -0.5 * a, 1.5 * a, -1.5 * a])
    torch.testing.assert_close(batch.advantages[:, -1], want, atol=1e-5, rtol=0)
    assert batch.advantages[:, :2].abs().sum() == 0
    # unweighted samples (no gate, or acceptance=skip): the advantages are unchanged
    plain = [Group(0, 0, [_traj(1.0, 0, None), _traj(0.0, 0, None)])]
    torch.testing.assert_close(
        algo.prepare(plain, trainer, StageTimer()).advantages[:, -1],
        torch.tensor([a, -a]),
        atol=1e-5,
        rtol=0,
    )


def test_importance_acceptance_needs_the_likelihood_gate_and_a_policy_gradient() -> None:
    with pytest.raises(PreflightError, match="needs selection.kind=likelihood"):
        check_selection(load_config(None, ["selection.acceptance=importance"]))
    ok = ["selection.kind=likelihood", "selection.acceptance=importance"]
    check_selection(load_config(None, ok))
    check_selection(load_config(None, [*ok, "algorithm.name=remax"]))


def test_a_spare_is_drawn_without_the_weight_of_an_earlier_decision() -> None:
    """A decision made ahead that expired, or one restored from a checkpoint, goes back to
    the spares with its weight; the pool draws it unweighted (the gate decides again)."""
    fresh = iter([Item(id="new", prompt="1+1=", answer="2")])
    sampler = LikelihoodSampler()
    RolloutPool(ScriptedBackend(), SampleStream(2, 1), fresh, sampler=sampler)
    held = weighted(Item(id="held", prompt="1+2=", answer="3"), 4.0)
    sampler._spares.append(held)
    drawn = sampler.issue(0)
    assert drawn.id == "held" and WEIGHT_KEY not in drawn.metadata
    assert sampler.issue(1).id == "new"

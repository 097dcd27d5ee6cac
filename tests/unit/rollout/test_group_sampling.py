"""rollout.group_sampling=stratified: a group's samples share a seed and member j of G
shifts its uniforms by j/G. Each sample alone is an exact draw from the policy; at a
context the members share, their G draws are one systematic sample of its distribution.
The episode never knows: member j's engine view stamps each of its requests."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from streamrl.config import load_config
from streamrl.core.types import (
    GenerationRequest,
    GenerationResult,
    Item,
    SamplingParams,
    Trajectory,
)
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.sampling import (
    context_key,
    counter_uniform,
    fold_tokens,
    shifted_uniform,
)
from streamrl.rollout.seeds import sampling_seed
from streamrl.rollout.selection import GroupSampler
from streamrl.rollout.selection.draws import StratumEngine, independent, stratified
from streamrl.rollout.worker import rollout_group
from streamrl.run.preflight import PreflightError, check_group_sampling
from tests.tiny_run import algorithm_of
from tests.unit.engines.test_inference_engine import tiny_llama

G = 8
PROMPT = [1, 2, 3]
TEMPERATURE = 0.05  # the random model is flat: this makes 4 tokens hold 0.11-0.45 each


def test_shifted_uniform_against_hand_values_and_zero_shift_is_bit_exact() -> None:
    u = torch.tensor([0.9, 0.1, 0.5, 0.0], dtype=torch.float64)
    out = shifted_uniform(u, [0.25, 0.0, 0.5, 0.875])
    assert torch.allclose(out, torch.tensor([0.15, 0.1, 0.0, 0.875], dtype=torch.float64))
    noise = counter_uniform(range(1000), [3] * 1000)
    assert torch.equal(shifted_uniform(noise, [0.0] * 1000), noise)  # independent: unchanged


def test_a_shifted_member_is_still_uniform() -> None:
    """frac(u + j/G) over 20,000 counter seeds fills ten equal bins evenly."""
    n = 20_000
    u = shifted_uniform(counter_uniform(range(n), [0] * n), [5 / G] * n)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0)
    assert ((counts - n / 10).abs() < 0.06 * n / 10).all(), counts


def test_members_share_a_key_exactly_while_they_share_a_context() -> None:
    """The noise key of a stratified request: seed and prompt, then each drawn token."""
    key = context_key(7, [1, 2, 3])
    assert key == context_key(7, [1, 2, 3])
    assert len({key, context_key(8, [1, 2, 3]), context_key(7, [1, 2, 4])}) == 3
    keys = np.array([key] * 3, dtype=np.uint64)
    after = fold_tokens(keys, [5, 5, 6])
    assert after[0] == after[1] != after[2]  # the third took another token: on its own
    assert fold_tokens(after[:1], [9])[0] != fold_tokens(after[2:], [9])[0]


def test_group_draws_share_one_seed_only_when_stratified() -> None:
    engine = object()
    assert independent(engine, 3, 17, 4) == [(engine, sampling_seed(3, 17, j)) for j in range(4)]
    members = stratified(engine, 3, 17, 4)
    assert [seed for _, seed in members] == [sampling_seed(3, 17, 0)] * 4
    assert all(isinstance(v, StratumEngine) and v.engine is engine for v, _ in members)
    assert [v.stratum for v, _ in members] == [(j, 4) for j in range(4)]


class _Recording:
    """Answers every request with one token, and keeps the requests."""

    version = 0

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return GenerationResult(request.prompt_ids, [5], [-0.1], [0], "stop")


async def _two_turns(engine, item, seed: int, greedy: bool = False) -> Trajectory:
    """An episode that knows nothing of strata: two requests, the second on a turn seed."""
    params = SamplingParams(max_new_tokens=1)
    for turn in range(2):
        await engine.agenerate(GenerationRequest([1, 2], params, seed + turn))
    one = torch.ones(1)
    return Trajectory(one.long(), one.bool(), one * 0, one.long() * 0, float(seed % 2), 0)


@pytest.mark.parametrize("rule", ["independent", "stratified"])
def test_every_request_of_a_member_carries_its_stratum_the_episode_unaware(rule: str) -> None:
    engine = _Recording()
    algorithm = algorithm_of(load_config(None, ["algorithm.dynamic_sampling=false"]))
    sampler = GroupSampler(stratified if rule == "stratified" else independent)
    item = Item(id="q", prompt="1+1=", answer="2", index=9)
    asyncio.run(rollout_group(engine, _two_turns, algorithm, item, 4, 3, sampler))
    got = sorted((r.seed, r.stratum or (-1, 0)) for r in engine.requests)
    if rule == "stratified":  # one seed (+ the turn), each member's stratum on both turns
        seed = sampling_seed(3, 9, 0)
        assert got == sorted((seed + t, (j, 4)) for j in range(4) for t in range(2))
    else:
        seeds = [sampling_seed(3, 9, j) for j in range(4)]
        assert got == sorted((s + t, (-1, 0)) for s in seeds for t in range(2))


def test_a_stratum_outside_its_group_is_refused() -> None:
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="need 0 <= j < G"):
        GenerationRequest([1], params, 0, stratum=(4, 4))


def _first_token_probabilities(model) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1]
    return torch.softmax(logits.double() / TEMPERATURE, -1)


def _first_tokens(engine: LocalEngine, seed: int, stratified: bool) -> list[int]:
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=3)
    requests = [
        GenerationRequest(PROMPT, params, seed if stratified else seed * G + j, stratum=s)
        for j in range(G)
        for s in [(j, G) if stratified else None]
    ]
    return [r.token_ids[0] for r in engine.generate(requests)]


def _systematic(tokens: list[int], p: torch.Tensor) -> bool:
    """Each token drawn floor(G p) or ceil(G p) times (systematic sampling's counts)."""
    counts = torch.bincount(torch.tensor(tokens), minlength=len(p)).double()
    expected = G * p
    return bool(
        ((counts >= torch.floor(expected + 1e-9)) & (counts <= torch.ceil(expected - 1e-9))).all()
    )


def test_a_stratified_group_spreads_its_draws_over_the_shared_distribution() -> None:
    model = tiny_llama()
    p = _first_token_probabilities(model)
    assert float(p.max()) > 1 / G  # the property has teeth: some token holds > 1/G
    engine = LocalEngine(model, decode_slots=G, max_seq_len=16)
    seeds = range(25)
    assert all(_systematic(_first_tokens(engine, s, True), p) for s in seeds)
    # independent draws break those counts for some seed: the check can fail
    assert not all(_systematic(_first_tokens(engine, s, False), p) for s in seeds)


def test_a_stratified_member_is_exact_and_the_same_alone_or_batched() -> None:
    """Its log-probs are the tempered log-softmax of a full forward, and its tokens do not
    depend on what else is in flight."""
    model = tiny_llama()
    engine = LocalEngine(model, decode_slots=4, max_seq_len=32)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=6)
    group = [GenerationRequest(PROMPT, params, 11, stratum=(j, 4)) for j in range(4)]
    together = engine.generate(group)
    alone = engine.generate([group[2]])[0]
    assert alone.token_ids == together[2].token_ids
    torch.testing.assert_close(
        torch.tensor(alone.logprobs), torch.tensor(together[2].logprobs), atol=1e-5, rtol=0
    )
    for r in together:
        ids = torch.tensor([PROMPT + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(PROMPT) - 1 : -1].double() / TEMPERATURE
        want = torch.log_softmax(logits, -1)[torch.arange(len(r.token_ids)), r.token_ids]
        assert torch.allclose(torch.tensor(r.logprobs, dtype=torch.float64), want, atol=1e-5)
    assert len({tuple(r.token_ids) for r in together}) > 1  # members differ


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name_or_path=mlp", "rollout.episode=gym"], "not environment policies"),
        (["rollout.engine=vllm"], "rollout.engine=vllm draws its own"),
        (["endpoint.enabled=true"], "external agents make their own requests"),
    ],
)
def test_preflight_refuses_what_cannot_stratify(overrides: list[str], message: str) -> None:
    check_group_sampling(load_config(None, overrides))  # independent: fine
    with pytest.raises(PreflightError, match=message):
        check_group_sampling(load_config(None, ["rollout.group_sampling=stratified", *overrides]))


def test_systematic_counts_by_hand() -> None:
    """The checker itself: p = (0.5, 0.3, 0.2) over G = 8 allows (4, 2-3, 1-2)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert _systematic([0] * 4 + [1] * 2 + [2] * 2, p)
    assert _systematic([0] * 4 + [1] * 3 + [2], p)
    assert not _systematic([0] * 5 + [1] * 2 + [2], p)
    assert math.isclose(float(G * p.sum()), G)

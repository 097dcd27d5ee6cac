"""Logits processing and counter-based sampling (streamrl.engines.inference.sampling)."""

from __future__ import annotations

import math

import torch

from streamrl.engines.inference.sampling import (
    counter_uniform,
    sample,
    sampling_logits,
    sampling_logprobs,
)


def _proc(logits, temperature=1.0, top_k=0, top_p=1.0):
    b = logits.shape[0]
    return sampling_logprobs(
        logits,
        torch.full((b,), float(temperature)),
        torch.full((b,), top_k, dtype=torch.long),
        torch.full((b,), float(top_p)),
    )


def test_counter_uniform_is_pure_and_uniform():
    seeds = torch.arange(20_000).tolist()
    u = counter_uniform(seeds, [3] * len(seeds))
    assert torch.equal(u, counter_uniform(seeds, [3] * len(seeds)))
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    # each decile holds ~10%: a crude but unflakeable uniformity check (fixed inputs)
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(seeds)
    assert float((hist - 0.1).abs().max()) < 0.01
    # position matters, and huge / negative seeds are reduced to 64 bits
    assert not torch.equal(u, counter_uniform(seeds, [4] * len(seeds)))
    big = counter_uniform([(2**70 + 5) & (2**64 - 1), (-1) & (2**64 - 1)], [0, 0])
    assert big.shape == (2,)


def test_greedy_uses_raw_logsoftmax_and_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 2.0], [3.0, 0.0, 0.5, 0.2]])
    lp = sampling_logprobs(logits, torch.zeros(2), torch.tensor([1, 2]), torch.tensor([0.1, 0.5]))
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1))  # filters ignored when greedy
    tokens, tok_lp = sample(
        lp, torch.tensor([True, True]), torch.tensor([0.99, 0.99], dtype=torch.float64)
    )
    assert tokens.tolist() == [1, 0]  # first index on ties
    torch.testing.assert_close(tok_lp, lp[[0, 1], [1, 0]])


def test_temperature_top_k_top_p_masks():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # temperature scales before the softmax
    torch.testing.assert_close(_proc(logits, temperature=0.5), torch.log_softmax(logits / 0.5, -1))
    # top-k keeps the k largest, renormalised
    lp = _proc(logits, top_k=2)
    assert torch.isinf(lp[0, 2:]).all()
    torch.testing.assert_close(lp[0, :2].exp(), torch.tensor([0.4, 0.3]) / 0.7)
    # top-p: minimal prefix whose mass reaches p (0.4 + 0.3 >= 0.7 -> two tokens)
    lp = _proc(logits, top_p=0.7)
    assert torch.isfinite(lp[0, :2]).all() and torch.isinf(lp[0, 2:]).all()
    lp = _proc(logits, top_p=0.71)
    assert torch.isfinite(lp[0, :3]).all() and torch.isinf(lp[0, 3])
    # tiny top-p still keeps the most likely token
    lp = _proc(logits, top_p=1e-6)
    assert torch.isfinite(lp[0, 0]) and torch.isinf(lp[0, 1:]).all()
    # top-k then top-p on the renormalised top-k set: {0.4, 0.3, 0.2}/0.9, p=0.7 -> 0.444 + 0.333
    lp = _proc(logits, top_k=3, top_p=0.7)
    assert torch.isfinite(lp[0, :2]).all() and torch.isinf(lp[0, 2:]).all()


def test_mixed_rows_are_processed_independently():
    torch.manual_seed(0)
    logits = torch.randn(3, 30)
    lp = sampling_logprobs(
        logits,
        torch.tensor([0.0, 1.0, 0.7]),
        torch.tensor([0, 5, 0]),
        torch.tensor([1.0, 1.0, 0.8]),
    )
    torch.testing.assert_close(lp[0], torch.log_softmax(logits[0], -1))
    torch.testing.assert_close(lp[1], _proc(logits[1:2], top_k=5)[0])
    torch.testing.assert_close(lp[2], _proc(logits[2:3], temperature=0.7, top_p=0.8)[0])


def test_empirical_frequencies_match_processed_distribution():
    torch.manual_seed(0)
    n = 20_000
    logits = torch.randn(1, 12).expand(n, 12)
    for kwargs in ({"temperature": 0.8}, {"top_k": 4}, {"top_p": 0.6, "temperature": 1.3}):
        lp = _proc(logits, **kwargs)
        probs = lp[0].exp()
        tokens, tok_lp = sample(
            lp, torch.zeros(n, dtype=torch.bool), counter_uniform(range(n), [0] * n)
        )
        freq = torch.bincount(tokens, minlength=12).double() / n
        # ~6 standard deviations: fixed seeds, so deterministic, and far from flaky anyway
        assert float((freq - probs.double()).abs().max()) < 6 * math.sqrt(0.25 / n), kwargs
        assert bool((probs[tokens] > 0).all()), f"masked token emitted with {kwargs}"
        torch.testing.assert_close(tok_lp, lp[0, tokens])


def test_sampling_is_independent_of_batch_composition():
    torch.manual_seed(1)
    logits = torch.randn(5, 40)
    lp = _proc(logits, temperature=1.0)
    seeds, steps = [11, 12, 13, 14, 15], [0, 3, 9, 1, 2]
    greedy = torch.zeros(5, dtype=torch.bool)
    batched, _ = sample(lp, greedy, counter_uniform(seeds, steps))
    for i in range(5):
        alone, _ = sample(lp[i : i + 1], greedy[:1], counter_uniform([seeds[i]], [steps[i]]))
        assert int(alone) == int(batched[i])


def test_two_level_cdf_matches_flat_inverse_cdf():
    torch.manual_seed(2)
    n, v = 4000, 1000
    logits = torch.randn(n, v) * 3
    scores = _proc(logits, top_p=0.9, temperature=0.9)  # many -inf entries
    u = counter_uniform(range(n), [5] * n)
    greedy = torch.zeros(n, dtype=torch.bool)
    blocked, lp = sample(scores, greedy, u, block=7)  # ragged last block
    flat, _ = sample(scores, greedy, u, block=v)  # one block = plain inverse CDF
    assert torch.equal(blocked, flat)
    assert bool(torch.isfinite(scores.gather(1, blocked[:, None])).all())
    torch.testing.assert_close(lp, scores.gather(1, blocked[:, None]).squeeze(1))
    # u -> 1 never runs past the last token with positive probability
    edge, _ = sample(
        scores[:3], greedy[:3], torch.full((3,), 1 - 2**-53, dtype=torch.float64), block=7
    )
    assert bool(torch.isfinite(scores[:3].gather(1, edge[:, None])).all())


def test_the_traced_draw_is_the_eager_one():
    """sample(traced=True), the compiled engine's draw (argmax always taken, the padding
    built by pad instead of written in place), gives the same tokens and log-probs, bit
    for bit, for vocabularies that are and are not a multiple of the block."""
    g = torch.Generator().manual_seed(3)
    for vocab in (100, 512, 1000):
        scores = 3 * torch.randn(6, vocab, generator=g)
        scores[2, 10:] = -math.inf  # a filtered row
        greedy = torch.tensor([False, True, False, False, True, False])
        uniforms = torch.rand(6, generator=g, dtype=torch.float64)
        eager, traced = (
            sample(scores, greedy, uniforms),
            sample(scores, greedy, uniforms, traced=True),
        )
        assert torch.equal(eager[0], traced[0]) and torch.equal(eager[1], traced[1])
        assert eager[0][2] < 10 and eager[0][1] == scores[1].argmax()


def test_any_finite_parameters_keep_at_least_the_argmax():
    """Extreme but finite temperature, top-k and top-p: every row keeps its most likely
    token with a finite score, and the draw is a kept token with a finite log-prob."""
    g = torch.Generator().manual_seed(4)
    logits = 5 * torch.randn(4, 300, generator=g)
    cases = [
        (1e-45, 0, 1.0),
        (1e-38, 0, 1.0),
        (1e-30, 3, 0.5),
        (1e30, 0, 1.0),
        (1.0, 0, 1e-300),
        (1.0, 0, 0.0),
        (1.0, 0, -1.0),
        (0.7, 0, 1e-45),
        (1.0, 1, 1.0),
        (1.0, -5, 1.0),
        (1.0, 2**62, 0.3),
        (1e-40, 1, 1e-300),
    ]
    for temperature, top_k, top_p in cases:
        scores = _proc(logits, temperature, top_k, top_p)
        best = logits.argmax(-1)
        assert bool(torch.isfinite(scores.gather(1, best[:, None])).all()), (
            temperature,
            top_k,
            top_p,
        )
        greedy = torch.zeros(4, dtype=torch.bool)
        tokens, lp = sample(scores, greedy, counter_uniform([1, 2, 3, 4], [0] * 4))
        assert bool(torch.isfinite(lp).all()) and bool(
            torch.isfinite(scores.gather(1, tokens[:, None])).all()
        )
    # a vanishing temperature or top-p leaves the argmax alone: a certain draw
    for temperature, top_p in ((1e-40, 1.0), (1.0, 1e-300)):
        scores = _proc(logits, temperature, 0, top_p)
        tokens, lp = sample(
            scores, torch.zeros(4, dtype=torch.bool), counter_uniform([5] * 4, range(4))
        )
        assert torch.equal(tokens, logits.argmax(-1)) and torch.equal(lp, torch.zeros(4))


def test_each_rows_processing_depends_on_that_row_alone():
    """Rows with every mix of options give the same scores, tokens and log-probs, bit for
    bit, alone and batched: in particular a row with top_p = 1 next to one with top_p < 1
    drops nothing (its cumulative mass rounds past 1 over a large vocabulary)."""
    g = torch.Generator().manual_seed(5)
    v, n = 49152, 8
    logits = 4 * torch.randn(n, v, generator=g)
    temperature = torch.tensor([1.0, 1.0, 0.7, 0.0, 1.3, 1.0, 0.5, 1.0])
    top_k = torch.tensor([0, 0, 50, 0, 0, 7, 0, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.95, 1.0, 0.6, 1.0])
    uniforms = counter_uniform(range(n), [3] * n)
    greedy = temperature <= 0
    scores = sampling_logits(logits, temperature, top_k, top_p)
    tokens, lp = sample(scores, greedy, uniforms)
    for i in range(n):
        one = slice(i, i + 1)
        alone = sampling_logits(logits[one], temperature[one], top_k[one], top_p[one])
        assert torch.equal(alone, scores[one]), i
        tok, tok_lp = sample(alone, greedy[one], uniforms[one])
        assert int(tok) == int(tokens[i]) and torch.equal(tok_lp, lp[one]), i
    assert bool(torch.isfinite(scores[0]).all())  # top_p = 1 beside top_p = 0.9

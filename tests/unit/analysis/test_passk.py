"""pass@k / avg@k against hand-computed values."""

from math import comb

import pytest

from streamrl.analysis.passk import avg_at_k, pass_at_k, pass_at_k_per_item, summarize_outcomes


def test_hand_computed_values() -> None:
    # n=5, c=2: pass@1 = c/n; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6.
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n - c < k: every subset of size k holds a correct sample.
    assert pass_at_k(5, 4, 2) == 1.0


def test_edge_cases() -> None:
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(3, 1, 3) == 1.0  # k = n: pass iff any sample is correct
    with pytest.raises(ValueError, match="k=6"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 0)


def test_stable_for_large_n() -> None:
    n, c, k = 1000, 3, 500  # C(1000, 500) ~ 1e299 would overflow a naive float ratio
    expected = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)
    assert 0.0 < pass_at_k(10_000, 1, 64) == pytest.approx(64 / 10_000)


def test_avg_at_k() -> None:
    assert avg_at_k(4, 1, 4) == 0.25
    assert avg_at_k(8, 6, 2) == 0.75
    with pytest.raises(ValueError):
        avg_at_k(2, 1, 4)


def test_summarize_outcomes_aggregates_over_items() -> None:
    outcomes = [
        [True, True, False, False, False],  # n=5, c=2
        [False] * 5,  # n=5, c=0
    ]
    summary = summarize_outcomes(outcomes, ks=(1, 2))
    assert summary["n_items"] == 2
    assert summary["pass@1"] == pytest.approx((0.4 + 0.0) / 2)
    assert summary["pass@2"] == pytest.approx((0.7 + 0.0) / 2)
    assert summary["avg@2"] == pytest.approx(0.2)
    assert list(pass_at_k_per_item(outcomes, 2)) == pytest.approx([0.7, 0.0])


def test_summarize_skips_k_above_sample_count() -> None:
    summary = summarize_outcomes([[True] * 4, [False] * 6])  # default ks=(1, 4, 8)
    assert "pass@4" in summary and "pass@8" not in summary
    assert summary["n_samples_min"] == 4
    with pytest.raises(ValueError, match="none of ks"):
        summarize_outcomes([[True, False]], ks=(4, 8))
    with pytest.raises(ValueError, match="empty"):
        summarize_outcomes([])
    with pytest.raises(ValueError, match="item 1 has no samples"):
        summarize_outcomes([[True], []])

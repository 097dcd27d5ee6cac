"""Sampling seeds fixed by what is sampled, never by timing or batching."""

from __future__ import annotations


def sampling_seed(run_seed: int, item_index: int, sample: int) -> int:
    """Per-request sampling seed: fixed by (run seed, item, sample), not by timing."""
    return ((run_seed * 1_000_003 + item_index) * 1_009 + sample) % (2**62)

"""Dedup in bounded memory (first occurrence kept) and the exactly-k sample."""

from __future__ import annotations

import numpy as np
import pytest

from nmt.data import dedup
from nmt.data.sample import sample_masks


def _key_files(tmp_path, sizes: list[int], seed: int) -> tuple[list, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 50, size=sum(sizes)).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # many repeats
    paths, start = [], 0
    for i, n in enumerate(sizes):
        paths.append(tmp_path / f"u{i}.npy")
        np.save(paths[-1], keys[start : start + n])
        start += n
    return paths, keys


@pytest.mark.parametrize("partition_pairs", [1_000_000, 7, 1])
def test_first_occurrence_wins_with_or_without_spill_files(tmp_path, monkeypatch, partition_pairs):
    monkeypatch.setattr(dedup, "PARTITION_PAIRS", partition_pairs)
    sizes = [0, 40, 13, 1, 60]
    paths, keys = _key_files(tmp_path, sizes, seed=1)
    seen: set[int] = set()
    expected = []
    for k in keys.tolist():
        expected.append(k not in seen)
        seen.add(k)
    masks = dedup.first_occurrences(paths, tmp_path)
    assert [len(m) for m in masks] == sizes
    assert np.concatenate(masks).tolist() == expected
    assert sum(expected) < len(expected) / 2  # the input did repeat
    assert not list(tmp_path.glob(".dedup.*"))  # spill files removed


def test_sample_picks_exactly_k_in_order_seeded():
    sizes = [5, 0, 30, 12, 53]
    masks = sample_masks(sizes, 20, seed=3)
    assert [len(m) for m in masks] == sizes and sum(int(m.sum()) for m in masks) == 20
    again, other = sample_masks(sizes, 20, seed=3), sample_masks(sizes, 20, seed=4)
    assert all((a == b).all() for a, b in zip(masks, again, strict=True))
    assert any((a != b).any() for a, b in zip(masks, other, strict=True))
    assert all(m.all() for m in sample_masks(sizes, 100, seed=3))  # k above the total: everything


def test_sample_is_uniform_over_positions():
    sizes, k, draws = [3, 10, 7], 5, 4000
    hits = sum(np.concatenate(sample_masks(sizes, k, seed=s)).astype(int) for s in range(draws))
    expected = draws * k / sum(sizes)  # 1000 per position
    assert np.abs(hits - expected).max() < 0.1 * expected  # ~6 standard deviations

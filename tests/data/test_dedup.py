"""Dedup in bounded memory (first occurrence kept)."""

from __future__ import annotations

import numpy as np
import pytest

from nmt.data import dedup


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

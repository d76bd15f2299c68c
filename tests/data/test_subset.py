"""The seeded k-of-n subset of `data.max_train_pairs` (`nmt.data.subset`): exactly k, per unit, uniform."""

from __future__ import annotations

import numpy as np

from nmt.data.subset import keep_subset, subset_masks


def test_the_subset_holds_exactly_k_in_order_seeded():
    sizes = [5, 0, 30, 12, 53]
    masks = subset_masks(sizes, 20, seed=3)
    assert [len(m) for m in masks] == sizes and sum(int(m.sum()) for m in masks) == 20
    again, other = subset_masks(sizes, 20, seed=3), subset_masks(sizes, 20, seed=4)
    assert all((a == b).all() for a, b in zip(masks, again, strict=True))
    assert any((a != b).any() for a, b in zip(masks, other, strict=True))
    assert all(m.all() for m in subset_masks(sizes, 100, seed=3))  # k above the total: everything


def test_the_subset_is_uniform_over_positions():
    sizes, k, draws = [3, 10, 7], 5, 4000
    hits = sum(np.concatenate(subset_masks(sizes, k, seed=s)).astype(int) for s in range(draws))
    expected = draws * k / sum(sizes)  # 1000 per position
    assert np.abs(hits - expected).max() < 0.1 * expected  # ~6 standard deviations


def test_keep_subset_draws_only_from_the_pairs_still_in():
    masks = [np.array([True, False, True, True]), np.array([False, False]), np.array([True, True, False])]
    kept, dropped = keep_subset(masks, 3, seed=1)
    assert sum(int(m.sum()) for m in kept) == 3 and dropped == 2
    assert all(not (k & ~m).any() for k, m in zip(kept, masks, strict=True))  # never a pair already out

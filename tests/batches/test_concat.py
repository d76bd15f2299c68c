"""Concatenation augmentation (`train.concat_pairs`, `nmt.batches.concat`): each window keeps its
pairs where they were and gains joined pairs of two of its own, whose lengths the sampler sees
and whose partners depend on (seed, window) only."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nmt.batches.batching import WindowSampler
from nmt.batches.concat import ConcatenatedPairs
from nmt.errors import NmtError
from nmt.train import loop
from nmt.train.update import TrainState


class Windows:
    """Pairs in windows of the given sizes; pair i is (src: [i]*a, tgt: [1000+i]*b) for varied a, b."""

    def __init__(self, sizes: list[int]) -> None:
        self.bounds = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        n = int(self.bounds[-1])
        self.pairs = [(np.full(1 + i % 5, i), np.full(2 + i % 3, 1000 + i)) for i in range(n)]

    def window_bounds(self) -> np.ndarray:
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        own = self.pairs[self.bounds[k] : self.bounds[k + 1]]
        return np.array([len(s) for s, _ in own]), np.array([len(t) for _, t in own])

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs[i]


def test_each_window_keeps_its_pairs_and_gains_joined_pairs_of_its_own():
    base = Windows([10, 7, 1])
    data = ConcatenatedPairs(base, 0.5, seed=1)
    assert data.window_bounds().tolist() == [0, 15, 25, 26]  # +5, +3, +0 (one pair cannot be joined)
    assert len(data) == 26
    for k in range(3):
        start, own = int(data.bounds[k]), int(base.bounds[k + 1] - base.bounds[k])
        src, tgt = data.window_lengths(k)
        for j in range(int(data.bounds[k + 1]) - start):
            s, t = data.pair(start + j)
            assert (len(s), len(t)) == (src[j], tgt[j])  # the sampler batches what the loader reads
            if j < own:
                assert s.tolist() == base.pair(int(base.bounds[k]) + j)[0].tolist()
                continue
            firsts = list(dict.fromkeys(s.tolist()))  # the source ids name the pairs joined
            assert len(firsts) == 2 and all(base.bounds[k] <= i < base.bounds[k + 1] for i in firsts)
            assert t.tolist() == [*base.pair(firsts[0])[1], *base.pair(firsts[1])[1]]  # target joined alike


def test_the_partners_depend_on_seed_and_window_only():
    base = Windows([50, 50])
    a, b = ConcatenatedPairs(base, 1.0, seed=1), ConcatenatedPairs(base, 1.0, seed=1)
    b.partners(1)  # another window's draw first changes nothing
    for k in (0, 1):
        assert all(np.array_equal(x, y) for x, y in zip(a.partners(k), b.partners(k), strict=True))
    other = ConcatenatedPairs(base, 1.0, seed=2)
    assert not np.array_equal(a.partners(0)[0], other.partners(0)[0])
    first, second = a.partners(0)
    assert (first != second).all() and len(set(zip(first.tolist(), second.tolist(), strict=True))) > 40


def test_a_fraction_outside_zero_to_one_is_a_one_line_error():
    for bad in (0.0, 1.5):
        with pytest.raises(NmtError, match="train.concat_pairs"):
            ConcatenatedPairs(Windows([4]), bad, seed=1)


def test_the_sampler_batches_joined_pairs_by_their_lengths_and_skips_long_ones():
    base = Windows([40])
    data = ConcatenatedPairs(base, 1.0, seed=3)
    sampler = WindowSampler(data, max_tokens=64, max_len=8, seed=3)
    src, tgt = data.window_lengths(0)
    seen = np.concatenate(sampler.window_batches(0))
    assert set(seen.tolist()) == {i for i in range(80) if max(src[i], tgt[i]) <= 8}
    assert (seen >= 40).sum() > 10 and sampler.skipped == int((np.maximum(src, tgt) > 8).sum()) > 0


@pytest.mark.slow
def test_training_reads_joined_pairs_only_when_asked(tiny_run):
    """TrainData.open wraps the encoded split with train.concat_pairs on and leaves it alone when off."""
    from conftest import ROOT

    from nmt.config import load_config

    info = SimpleNamespace(rank=0, world_size=1, is_main=False)
    config = load_config(ROOT / "configs" / "tiny.yaml")
    plain = loop.TrainData.open(config, tiny_run, torch.device("cpu"), info, "fp32")
    config.train.concat_pairs = 0.25
    joined = loop.TrainData.open(config, tiny_run, torch.device("cpu"), info, "fp32")
    assert isinstance(joined.dataset, ConcatenatedPairs) and not isinstance(plain.dataset, ConcatenatedPairs)
    assert len(joined.dataset) == len(plain.dataset) + int(len(plain.dataset) * 0.25)
    feed = loop.BatchFeed(joined, 1, TrainState(), torch.device("cpu"))
    try:
        assert feed.next(TrainState())[0].src.shape[0] > 0
    finally:
        feed.close()

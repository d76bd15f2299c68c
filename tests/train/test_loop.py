"""The training loop's batch feed (nmt/train/loop.py `BatchFeed`) and its background `Prefetcher`:
built ahead or on use, the same batches and the same saved data position."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nmt.batches.batching import Prefetcher, TokenBatchSampler
from nmt.train import loop
from nmt.train.update import TrainState

CPU = torch.device("cpu")


class Pairs:
    """An in-memory `PairDataset` of random pairs."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.pairs = [(rng.integers(4, 50, rng.integers(1, 12)), rng.integers(4, 50, rng.integers(1, 12)))
                      for _ in range(n)]  # fmt: skip
        self.src_lengths = np.array([len(s) for s, _ in self.pairs])
        self.tgt_lengths = np.array([len(t) for _, t in self.pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs[i]


def train_data(n: int = 120) -> SimpleNamespace:
    """What `BatchFeed` needs of `TrainData`: the dataset and its sampler (a dozen or more batches)."""
    dataset = Pairs(n)
    sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, max_tokens=60, max_len=20, seed=3)
    return SimpleNamespace(dataset=dataset, sampler=sampler, subwords=None)


def feed_run(data, state: TrainState, groups: int, k: int) -> list[tuple[list, tuple[int, int]]]:
    """`groups` groups from `state`: (their batches' tensors, the data position after each)."""
    feed = loop.BatchFeed(data, k, state, CPU)
    try:
        out = []
        for _ in range(groups):
            batches = feed.next(state)
            tensors = [(*b, b.src_packing.index, b.tgt_packing.cu_seqlens) for b in batches]
            out.append((tensors, (state.epoch, state.batch_in_epoch)))
        return out
    finally:
        feed.close()


def same(a: list, b: list) -> bool:
    """Two `feed_run`s: equal positions and equal tensors, group by group."""
    if len(a) != len(b):
        return False
    for (tensors_a, pos_a), (tensors_b, pos_b) in zip(a, b, strict=True):
        if pos_a != pos_b or len(tensors_a) != len(tensors_b):
            return False
        pairs = [(x, y) for ba, bb in zip(tensors_a, tensors_b, strict=True) for x, y in zip(ba, bb, strict=True)]
        if not all(torch.equal(x, y) for x, y in pairs):
            return False
    return True


@pytest.mark.parametrize("start", [(0, 0), (1, 5)])  # a fresh run and a resumed one, mid-epoch
def test_prefetched_groups_are_the_synchronous_ones_with_the_same_position(monkeypatch, start):
    data = train_data()
    groups = len(data.sampler)  # of 2 batches: across an epoch boundary (a group never spans two)
    sync = feed_run(data, TrainState(epoch=start[0], batch_in_epoch=start[1]), groups, k=2)
    monkeypatch.setattr(loop, "PREFETCH_DEVICES", ("cpu",))
    ahead = feed_run(data, TrainState(epoch=start[0], batch_in_epoch=start[1]), groups, k=2)
    assert same(sync, ahead)
    assert sync[-1][1][0] > start[0] and len(data.sampler) > 10  # the run crossed into the next epoch


def test_the_position_is_that_of_the_groups_handed_out_not_of_those_built(monkeypatch):
    monkeypatch.setattr(loop, "PREFETCH_DEVICES", ("cpu",))
    data, state = train_data(), TrainState()
    feed = loop.BatchFeed(data, 2, state, CPU)
    try:
        assert feed.ahead is not None
        feed.next(state)
        deadline = time.monotonic() + 10
        while not feed.ahead._queue.full():  # the thread has built PREFETCH_DEPTH groups beyond
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert (state.epoch, state.batch_in_epoch) == (0, 2)  # what a checkpoint now saves
    finally:
        feed.close()
    assert not feed.ahead._thread.is_alive()


def test_the_synchronous_feed_is_the_default_on_a_cpu():
    feed = loop.BatchFeed(train_data(), 1, TrainState(), CPU)
    assert feed.ahead is None


def test_prefetcher_keeps_order_and_bounds_the_queue():
    made = []

    def source():
        for i in range(20):
            made.append(i)
            yield i

    p = Prefetcher(source(), depth=2)
    try:
        deadline = time.monotonic() + 10
        while not (p._queue.full() and len(made) == 3):  # two queued, the third made: the thread waits
            assert len(made) <= 3 and time.monotonic() < deadline, made
            time.sleep(0.01)
        assert [next(p) for _ in range(20)] == list(range(20))
        with pytest.raises(StopIteration):
            next(p)
    finally:
        p.close()


def test_prefetcher_raises_what_the_source_raised_and_closes():
    def source():
        yield 1
        raise ValueError("corrupt shard")

    p = Prefetcher(source(), depth=1)
    assert next(p) == 1
    for _ in range(2):  # and again on every later call
        with pytest.raises(ValueError, match="corrupt shard"):
            next(p)
    p.close()

    endless = Prefetcher(iter(lambda: 0, 1), depth=1)
    endless.close()
    assert not endless._thread.is_alive()

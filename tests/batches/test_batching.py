from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import ListDataset

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.batches.batching import (
    Batch,
    InMemory,
    TokenBatchSampler,
    WindowSampler,
    collate,
    id_matrix,
    load_batch,
    pad_sources,
)
from nmt.errors import NmtError
from nmt.model.masks import Packing


def random_lengths(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 60, n), rng.integers(0, 60, n)


def test_budget_respected_and_every_kept_pair_once_per_epoch():
    src, tgt = random_lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens=200, max_len=50, seed=3)
    too_long = (src > 50) | (tgt > 50)
    assert sampler.skipped == int(too_long.sum()) > 0
    for epoch in range(3):
        batches = sampler.epoch_batches(epoch)
        for b in batches:
            assert len(b) * (max(src[b].max(), tgt[b].max()) + 1) <= 200
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == np.flatnonzero(~too_long).tolist()


def test_batches_are_length_sorted_and_well_filled():
    src, tgt = random_lengths(2000)
    sampler = TokenBatchSampler(src, tgt, max_tokens=400, max_len=64, seed=1)
    # greedy: adding the next pair (in length order) to a batch would break the budget
    firsts = [b[0] for b in sampler.batches[1:]]
    for b, nxt in zip(sampler.batches[:-1], firsts, strict=True):
        longest = max(src[b].max(), tgt[b].max(), src[nxt], tgt[nxt]) + 1
        assert (len(b) + 1) * longest > 400
    assert sampler.padding_waste < 0.6


def test_deterministic_per_seed_and_shuffled_per_epoch():
    src, tgt = random_lengths()

    def orders(seed: int) -> list[list[int]]:
        s = TokenBatchSampler(src, tgt, max_tokens=300, max_len=64, seed=seed)
        return [[int(b[0]) for b in s.epoch_batches(e)] for e in range(2)]

    assert orders(5) == orders(5)
    assert orders(5) != orders(6)
    first, second = orders(5)
    assert first != second and sorted(first) == sorted(second)


def test_shards_have_equal_counts_and_are_disjoint():
    src, tgt = random_lengths(700)
    world = 3
    shards = [TokenBatchSampler(src, tgt, 250, 64, seed=2, rank=r, world_size=world) for r in range(world)]
    total = len(shards[0].batches)
    for epoch in range(2):
        per_rank = [s.epoch_batches(epoch) for s in shards]
        assert len({len(p) for p in per_rank}) == 1 and len(per_rank[0]) == total // world
        ids = np.concatenate([np.concatenate(p) for p in per_rank])
        assert len(ids) == len(set(ids.tolist()))  # no pair on two ranks
        dropped = total - world * len(per_rank[0])
        assert dropped == total % world
        # interleaved: rank r takes batches r, r+W, ... of the epoch order
        order = list(shards[0].epoch_order(epoch))
        assert all(np.array_equal(a, b) for a, b in zip(per_rank[1], order[1::world], strict=False))


def test_too_few_batches_for_ranks_is_an_error():
    with pytest.raises(NmtError, match="ranks"):
        TokenBatchSampler(np.array([3]), np.array([3]), 100, 10, rank=0, world_size=2)


def test_resume_mid_epoch_continues_the_same_order():
    src, tgt = random_lengths()
    sampler = TokenBatchSampler(src, tgt, 300, 64, seed=9)
    full = list(sampler.iter_epoch(4))
    rest = list(sampler.iter_epoch(4, start=7))
    assert len(rest) == len(full) - 7
    assert all(np.array_equal(a, b) for a, b in zip(full[7:], rest, strict=True))


def test_no_shuffle_keeps_length_order():
    src, tgt = random_lengths()
    sampler = TokenBatchSampler(src, tgt, 300, 64, seed=9, shuffle=False)
    firsts = [int(src[b[0]]) for b in sampler.epoch_batches(0)]
    assert firsts == sorted(firsts)


class Windows:
    """Lengths in windows (as an encoded split's shards), counting each window's reads."""

    def __init__(self, sizes: list[int], seed: int = 0) -> None:
        self.src, self.tgt = random_lengths(sum(sizes), seed)
        self.bounds = np.concatenate(([0], np.cumsum(sizes)))
        self.reads: list[int] = []

    def window_bounds(self) -> np.ndarray:
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.reads.append(k)
        a, b = self.bounds[k], self.bounds[k + 1]
        return self.src[a:b], self.tgt[a:b]


def rank_share(sampler: WindowSampler, epoch: int, g: int, updates: int) -> tuple[list[np.ndarray], int]:
    """`updates` single batches from position g (or fewer, to the end of the epoch), and the position after."""
    out = []
    for _ in range(updates):
        if not sampler.rank_count(g):
            break
        batches, g = sampler.take(epoch, g, 1)
        out += batches
    return out, g


def test_windows_batch_alone_and_every_kept_pair_is_in_one_batch_per_epoch():
    w = Windows([300, 5, 250, 420])
    sampler = WindowSampler(w, max_tokens=200, max_len=50, seed=4)
    kept = np.flatnonzero((w.src <= 50) & (w.tgt <= 50))
    assert sampler.kept == len(kept) and sampler.skipped == 975 - len(kept) > 0
    orders = []
    for epoch in range(3):
        batches = list(sampler.epoch_order(epoch))
        assert len(batches) == sampler.total == sum(sampler.counts)
        assert sorted(np.concatenate(batches).tolist()) == kept.tolist()  # every kept pair exactly once
        for b in batches:
            window = np.searchsorted(w.bounds, b, side="right") - 1
            assert len(set(window.tolist())) == 1  # a batch never mixes windows
            assert len(b) * (max(w.src[b].max(), w.tgt[b].max()) + 1) <= 200
        orders.append(sampler.window_order(epoch).tolist())
        assert sorted(orders[-1]) == [0, 1, 2, 3]
    assert len({tuple(o) for o in orders}) > 1  # the window order changes with the epoch


def test_an_epoch_reads_each_window_once_and_keeps_at_most_two():
    w = Windows([200, 200, 200, 200, 200])
    sampler = WindowSampler(w, max_tokens=300, max_len=64, seed=2)
    assert sorted(w.reads) == [0, 1, 2, 3, 4]  # opening counts every window's batches once
    w.reads.clear()
    rank_share(sampler, epoch=1, g=0, updates=sampler.total)
    assert w.reads == sampler.window_order(1).tolist()  # then one window after the other, each once
    assert len(sampler._cache) <= 2


def test_one_window_in_memory_is_the_token_batch_sampler():
    src, tgt = random_lengths(400)
    a = TokenBatchSampler(src, tgt, 300, 64, seed=3)
    b = WindowSampler(InMemory(src, tgt), 300, 64, seed=3)
    for epoch in range(2):
        assert all(np.array_equal(x, y) for x, y in zip(a.epoch_batches(epoch), b.epoch_batches(epoch), strict=True))


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (3, 2)])
def test_the_data_position_resumes_exactly_at_another_rank_count(before, after):
    """Ranks on `before` processes up to a checkpoint, then on `after`: every batch of the epoch from
    the start, once, in the epoch's order (less the last, fewer than `after`, batches)."""
    w = Windows([300, 260, 310])
    epoch, updates = 2, 7
    order = list(WindowSampler(w, 250, 64, seed=6).epoch_order(epoch))
    old = [WindowSampler(w, 250, 64, seed=6, rank=r, world_size=before) for r in range(before)]
    shares = [rank_share(s, epoch, 0, updates) for s in old]
    g = shares[0][1]
    assert {pos for _, pos in shares} == {g} == {updates * before}  # the same position on every rank
    new = [WindowSampler(w, 250, 64, seed=6, rank=r, world_size=after) for r in range(after)]
    rest = [rank_share(s, epoch, g, len(order)) for s in new]
    seen = [b for step in zip(*(s for s, _ in shares), strict=True) for b in step]
    seen += [b for step in zip(*(s for s, _ in rest), strict=True) for b in step]
    assert len(seen) == len(order) - (len(order) - g) % after
    assert all(np.array_equal(a, b) for a, b in zip(seen, order, strict=False))


def test_collate_adds_bos_eos_and_right_pads():
    src, tgt_in, tgt_out = collate([([5, 6, 7], [8]), ([9], [10, 11, 12, 13])])
    assert src.tolist() == [[5, 6, 7, EOS_ID], [9, EOS_ID, PAD_ID, PAD_ID]]
    assert tgt_in.tolist() == [[BOS_ID, 8, PAD_ID, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12, 13]]
    assert tgt_out.tolist() == [[8, EOS_ID, PAD_ID, PAD_ID, PAD_ID], [10, 11, 12, 13, EOS_ID]]
    assert src.dtype == tgt_in.dtype == torch.long


def test_id_matrix_is_the_row_by_row_padding():
    rng = np.random.default_rng(7)
    seqs = [rng.integers(4, 50, rng.integers(0, 9)).astype(np.int32) for _ in range(40)] + [[], [3]]
    for first, last, extra in ((None, EOS_ID, 1), (BOS_ID, None, 1), (None, None, 0), (BOS_ID, EOS_ID, 2)):
        width = max(len(q) for q in seqs) + extra + 3  # wider than needed: the rest is padding
        expected = np.full((len(seqs), width), PAD_ID, dtype=np.int64)
        for i, q in enumerate(seqs):
            row = ([] if first is None else [first]) + list(q) + ([] if last is None else [last])
            expected[i, : len(row)] = row
        got = id_matrix(seqs, width, first=first, last=last)
        assert got.dtype == np.int64 and np.array_equal(got, expected)
    assert np.array_equal(id_matrix([[], []], 2, last=EOS_ID), [[EOS_ID, PAD_ID], [EOS_ID, PAD_ID]])


def test_padding_waste_matches_collated_batches():
    rng = np.random.default_rng(4)
    pairs = [(list(rng.integers(4, 50, rng.integers(1, 20))), list(rng.integers(4, 50, rng.integers(1, 20))))
             for _ in range(200)]  # fmt: skip
    data = ListDataset(pairs)
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, 120, 64, seed=1)
    pad = slots = 0
    for b in sampler.batches:
        src, _, tgt_out = load_batch(data, b)
        pad += int((src == PAD_ID).sum() + (tgt_out == PAD_ID).sum())
        slots += src.numel() + tgt_out.numel()
    assert sampler.padding_waste == pytest.approx(pad / slots)
    assert sampler.kept == len(pairs)


# --------------------------------------------------------------------------- packing


def assert_packing_describes(packing: Packing, ids: torch.Tensor) -> None:
    """`packing` is where the non-PAD tokens of the right-padded (B, L) `ids` are."""
    real = ids != PAD_ID  # (B, L)
    lengths = real.sum(dim=1)  # (B,)
    assert torch.equal(real, torch.arange(ids.size(1))[None, :] < lengths[:, None])  # right padding
    assert torch.equal(packing.index, real.flatten().nonzero().squeeze(1))
    assert packing.cu_seqlens.dtype == torch.int32
    assert packing.cu_seqlens.tolist() == [0] + lengths.cumsum(0).tolist()
    assert packing.max_len == int(lengths.max()) and isinstance(packing.max_len, int)
    assert packing.width == ids.size(1)
    assert packing.index.device.type == packing.cu_seqlens.device.type == "cpu"  # built on the host


def test_batches_carry_the_packing_of_their_padded_tensors():
    rng = np.random.default_rng(11)
    pairs = [(list(rng.integers(4, 50, rng.integers(0, 20))), list(rng.integers(4, 50, rng.integers(0, 20))))
             for _ in range(150)] + [([], [7]), ([5], [])]  # fmt: skip
    data = ListDataset(pairs)
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, 100, 64, seed=2)
    for b in sampler.batches:
        batch = load_batch(data, b)
        assert isinstance(batch, Batch)
        assert_packing_describes(batch.src_packing, batch.src)
        assert_packing_describes(batch.tgt_packing, batch.tgt_in)
        assert_packing_describes(batch.tgt_packing, batch.tgt_out)  # the same lengths: EOS for BOS
        assert batch.packing == (batch.src_packing, batch.tgt_packing)


def test_a_batch_unpacks_as_its_tensors_and_moves_with_its_packing():
    batch = collate([([5, 6, 7], [8]), ([9], [10, 11, 12, 13])])
    src, tgt_in, tgt_out = batch  # what validation and the benchmarks read
    assert src is batch.src and tgt_in is batch.tgt_in and tgt_out is batch.tgt_out
    assert batch.src_packing.cu_seqlens.tolist() == [0, 4, 6] and batch.src_packing.max_len == 4
    assert batch.tgt_packing.cu_seqlens.tolist() == [0, 2, 7] and batch.tgt_packing.max_len == 5
    moved = batch.to("cpu")
    assert torch.equal(moved.src, src) and torch.equal(moved.tgt_packing.index, batch.tgt_packing.index)
    assert (moved.src_packing.max_len, moved.tgt_packing.width) == (4, 5)


def test_pad_sources_is_the_one_source_batch():
    from nmt.decode import engines

    seqs = [[5, 6, 7], [8], []]
    src = pad_sources(seqs)
    assert src.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID], [EOS_ID, PAD_ID, PAD_ID, PAD_ID]]
    assert src.dtype == torch.long
    assert engines.pad_sources is pad_sources  # the decoding engines use the same function
    pairs = [(np.array(s, dtype=np.int32), np.array([9], dtype=np.int32)) for s in seqs]
    assert torch.equal(collate(pairs).src, src)  # and so does training's collate

"""Token-budget batches formed window by window, shared out over ranks by position; collate.

A batch's padded size is ``n_sentences * max(longest src + 1, longest tgt + 1)`` (the +1 is
the EOS on the source/target and the BOS on the decoder input) and never exceeds
``max_tokens``. The pairs come in *windows* (an encoded split's shards, `nmt.data.encoded`, or
one window of lengths held in memory): a window's batches are formed once, greedily, over its
pairs sorted by (src_len, tgt_len) (ties broken by a permutation seeded by (seed, window)), so each
batch holds similar lengths and padding is small. Pairs with a side longer than ``max_len`` are
skipped and counted. Only one window's lengths and batches are in memory at a time: the
sampler's memory follows the window, not the corpus.

An epoch visits the windows in an order seeded by (seed, epoch) and each window's batches in an
order seeded by (seed, epoch, window); every kept pair is in exactly one batch of the epoch.
Batch g of that order is the epoch's *global* batch g. Training's data position is (epoch, g):
from g, rank r of W takes the batches g + r, g + r + W, ..., the same count on every rank; the
last (fewer than W) batches of the epoch are left out of it, so no rank waits forever in a
collective. The position is the same on every rank and means the same at any W, so a
checkpoint written on W ranks resumes exactly on any other number.

`collate` makes a `Batch`: the padded id tensors plus, for each side, a `Packing` (where the real
tokens are, cu_seqlens, the longest length) computed here on the host from the sentence lengths, so
that the flash attention backend never reads them back from the device, nor training its token
counts (`Batch.real_tokens`). `Prefetcher` builds batches ahead in a background thread (training on
a GPU, with `Batch.pin_memory` for copies that do not wait).
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.errors import NmtError
from nmt.model.masks import Packing, packing_from_lengths

T = TypeVar("T")
_CACHED = 2  # windows whose batches a sampler keeps (one more than the one in use)
_BLOCK = 1 << 16  # pair sizes turned into Python ints at once when forming a window's batches


class PairDataset(Protocol):
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int: ...
    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


class LengthWindows(Protocol):
    """Pairs in windows, each read alone: `nmt.data.encoded.ParallelSplit` (its shards), `InMemory`."""

    def window_bounds(self) -> np.ndarray: ...  # (S+1,) int64: window k holds pairs bounds[k]:bounds[k+1]
    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]: ...  # (src, tgt) pieces of window k


class InMemory:
    """Length arrays held in memory as one window."""

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> None:
        self.src = np.asarray(src_lengths, dtype=np.int64)
        self.tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if self.src.shape != self.tgt.shape:
            raise NmtError(f"source and target have different sentence counts ({len(self.src)} vs {len(self.tgt)})")

    def window_bounds(self) -> np.ndarray:
        return np.array([0, len(self.src)], dtype=np.int64)

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src, self.tgt


@dataclass(frozen=True)
class _WindowStats:
    batches: int
    kept: int
    skipped: int
    real_tokens: int  # src + tgt pieces, EOS/BOS included
    padded_tokens: int  # slots of the collated src + tgt_out


class WindowSampler:
    """Fixed token-budget batches, window by window; per-epoch shuffled order; per-rank share.

    Args:
        windows: the pairs' lengths, a window at a time (`LengthWindows`).
        max_tokens: budget for ``n_sentences * (longest side + 1)``.
        max_len: pairs with a side longer than this are skipped (counted in ``skipped``).
        seed: fixes tie-breaking within equal lengths and the per-epoch shuffles.
        rank, world_size: this process's share.
        shuffle: shuffle window and batch order per epoch (off for validation: length order).

    Opening reads every window once (lengths only) to count its batches: the map from a global
    batch index to (window, batch) that resuming at any position needs.
    """

    def __init__(
        self,
        windows: LengthWindows,
        max_tokens: int,
        max_len: int,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.windows, self.max_tokens, self.seed, self.shuffle = windows, max_tokens, seed, shuffle
        self.limit = min(max_len, max_tokens - 1)  # a pair must fit in a batch of one
        self.rank, self.world_size = rank, world_size
        self.starts = np.asarray(windows.window_bounds(), dtype=np.int64)
        self._cache: collections.OrderedDict[tuple[int, int], list[np.ndarray]] = collections.OrderedDict()
        self._lock = threading.Lock()
        stats = [self._stats(k) for k in range(len(self.starts) - 1)]
        self.counts = np.array([s.batches for s in stats], dtype=np.int64)  # batches per window
        self.kept, self.skipped = sum(s.kept for s in stats), sum(s.skipped for s in stats)
        self.real_tokens = sum(s.real_tokens for s in stats)
        self.padded_tokens = sum(s.padded_tokens for s in stats)
        if self.total < world_size:
            raise NmtError(f"only {self.total} batch(es) for {world_size} ranks: the training split is too small")

    def _stats(self, k: int) -> _WindowStats:
        src, tgt = self.windows.window_lengths(k)
        idx, cuts = _window_batches(src, tgt, self.limit, self.max_tokens, (self.seed, k))
        padded = 0
        if len(idx):
            longest = np.maximum.reduceat(src[idx], cuts[:-1]) + np.maximum.reduceat(tgt[idx], cuts[:-1]) + 2
            padded = int(np.dot(np.diff(cuts), longest))
        real = int(src[idx].sum() + tgt[idx].sum() + 2 * len(idx))
        return _WindowStats(len(cuts) - 1, len(idx), len(src) - len(idx), real, padded)

    @property
    def total(self) -> int:
        """Batches per epoch, all ranks together."""
        return int(self.counts.sum())

    @property
    def padding_waste(self) -> float:
        """Fraction of the collated src + tgt_out slots over all batches that are padding."""
        return 1.0 - self.real_tokens / max(self.padded_tokens, 1)

    def __len__(self) -> int:
        """Batches this rank gets per epoch (from its start)."""
        return self.total // self.world_size

    def window_order(self, epoch: int) -> np.ndarray:
        """The windows in the order `epoch` visits them."""
        n = len(self.counts)
        return np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)

    def window_batches(self, k: int) -> list[np.ndarray]:
        """Window k's batches as split indices, in length order (formed anew on every call)."""
        src, tgt = self.windows.window_lengths(k)
        idx, cuts = _window_batches(src, tgt, self.limit, self.max_tokens, (self.seed, k))
        return [idx[a:b] + self.starts[k] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def _shuffled(self, epoch: int, k: int) -> list[np.ndarray]:
        """Window k's batches in `epoch`'s order. The last `_CACHED` are kept: the loader and a
        prefetch thread may be in two windows at once."""
        with self._lock:
            if (epoch, k) in self._cache:
                self._cache.move_to_end((epoch, k))
                return self._cache[epoch, k]
            batches = self.window_batches(k)
            if self.shuffle:
                order = np.random.default_rng((self.seed, epoch, k)).permutation(len(batches))
                batches = [batches[i] for i in order]
            self._cache[epoch, k] = batches
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
            return batches

    def batch(self, epoch: int, g: int) -> np.ndarray:
        """Global batch g of `epoch` (0 <= g < total)."""
        order = self.window_order(epoch)
        ends = np.cumsum(self.counts[order])
        at = int(np.searchsorted(ends, g, side="right"))
        return self._shuffled(epoch, int(order[at]))[g - int(ends[at] - self.counts[order[at]])]

    def epoch_order(self, epoch: int) -> Iterator[np.ndarray]:
        """Every batch of `epoch` in order, before sharing out (every kept pair once)."""
        for k in self.window_order(epoch):
            yield from self._shuffled(epoch, int(k))

    def rank_count(self, g: int) -> int:
        """Batches each rank takes in the rest of an epoch from global position g."""
        return max(self.total - g, 0) // self.world_size

    def take(self, epoch: int, g: int, k: int) -> tuple[list[np.ndarray], int]:
        """This rank's next (up to) k batches of `epoch` from global position g, and the position after
        them (the same on every rank): batches g + rank + j * world_size for j < k."""
        n = min(k, self.rank_count(g))
        batches = [self.batch(epoch, g + self.rank + j * self.world_size) for j in range(n)]
        return batches, g + n * self.world_size

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of `epoch`, from its `start`-th (global position start * world_size)."""
        g = start * self.world_size
        while self.rank_count(g):
            batches, g = self.take(epoch, g, 1)
            yield batches[0]

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch` (the same count on every rank)."""
        return list(self.iter_epoch(epoch))


class TokenBatchSampler(WindowSampler):
    """`WindowSampler` over length arrays held in memory (one window): validation, tests.

    Args: src_lengths, tgt_lengths: (N,) pieces per sentence, without BOS/EOS; the rest as `WindowSampler`.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        max_len: int,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ) -> None:
        super().__init__(InMemory(src_lengths, tgt_lengths), max_tokens, max_len, seed, rank, world_size, shuffle)

    @property
    def batches(self) -> list[np.ndarray]:
        """Every batch, in length order."""
        return self.window_batches(0)


def _window_batches(
    src: np.ndarray, tgt: np.ndarray, limit: int, max_tokens: int, seed: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy batches over one window's kept pairs sorted by (src_len, tgt_len), ties in an order
    seeded by `seed`. Returns (window indices in batch order, cuts): batch b is idx[cuts[b]:cuts[b+1]]."""
    idx = np.random.default_rng(seed).permutation(len(src))
    idx = idx[(src[idx] <= limit) & (tgt[idx] <= limit)]
    idx = idx[np.lexsort((tgt[idx], src[idx]))]  # stable: primary src, then tgt
    sizes = np.maximum(src[idx], tgt[idx]) + 1
    cuts, start, longest = [0], 0, 0
    for block in range(0, len(sizes), _BLOCK):  # Python ints a block at a time (a list of all is big)
        for pos, size in enumerate(sizes[block : block + _BLOCK].tolist(), block):
            grown = longest if longest > size else size
            if pos > start and (pos - start + 1) * grown > max_tokens:
                cuts.append(pos)
                start, grown = pos, size
            longest = grown
    if start < len(sizes):
        cuts.append(len(sizes))
    return idx, np.array(cuts, dtype=np.int64)


def id_matrix(
    seqs: Sequence[Sequence[int]], width: int, *, first: int | None = None, last: int | None = None
) -> np.ndarray:
    """(B, width) int64 rows, right-padded with PAD_ID: each sequence, after `first` and followed
    by `last` where they are given. One scatter of the joined ids into the padded matrix (no
    Python loop over the sentences); `width` must hold the longest row."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))  # (B,)
    rows = np.full((len(seqs), width), PAD_ID, dtype=np.int64)
    start = 0 if first is None else 1
    if first is not None:
        rows[:, 0] = first
    if lengths.sum():
        body = np.arange(width - start) < lengths[:, None]  # (B, width - start): the ids' slots
        rows[:, start:][body] = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
    if last is not None:
        rows[np.arange(len(seqs)), lengths + start] = last
    return rows


def pad_sources(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """THE padded source batch: (B, S) int64, each sequence + EOS, right-padded with PAD_ID.

    S is the longest sequence + 1. Used by training (`collate`), validation and every
    decoding engine."""
    width = max(len(s) for s in seqs) + 1
    return torch.from_numpy(id_matrix(seqs, width, last=EOS_ID))


@dataclass(frozen=True, eq=False)
class Batch:
    """One training batch: three int64 id tensors, right-padded with PAD_ID, and the `Packing` of
    each side, computed on the host (CPU tensors) from the sentence lengths.

    Iterates as ``(src, tgt_in, tgt_out)``, so ``src, tgt_in, tgt_out = collate(pairs)`` reads the
    three tensors (and leaves the packing behind: the model then unpads from the masks)."""

    src: torch.Tensor  # (B, S): ids + [EOS]
    tgt_in: torch.Tensor  # (B, T): [BOS] + ids
    tgt_out: torch.Tensor  # (B, T): ids + [EOS]; the same lengths as tgt_in
    src_packing: Packing  # the real tokens of src
    tgt_packing: Packing  # the real tokens of tgt_in (and tgt_out)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.src, self.tgt_in, self.tgt_out))

    @property
    def packing(self) -> tuple[Packing, Packing]:
        """(source, target): what `Transformer.forward(..., packing=)` takes."""
        return self.src_packing, self.tgt_packing

    @property
    def real_tokens(self) -> tuple[int, int]:
        """(source, target) real tokens, EOS / BOS included: the sizes of the packings' indices, host
        ints wherever the tensors are (reading them waits for no device)."""
        return self.src_packing.index.numel(), self.tgt_packing.index.numel()

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        """Every tensor (ids and packings) on `device`; the host ints stay. From pinned host memory
        (`pin_memory`) a copy to a GPU with ``non_blocking`` does not wait."""
        src, tgt_in, tgt_out = (t.to(device, non_blocking=non_blocking) for t in self)
        packings = (p.to(device, non_blocking=non_blocking) for p in self.packing)
        return Batch(src, tgt_in, tgt_out, *packings)

    def pin_memory(self) -> Batch:
        """The same batch in page-locked host memory (needs CUDA), for asynchronous copies."""
        src, tgt_in, tgt_out = (t.pin_memory() for t in self)
        packings = (Packing(p.index.pin_memory(), p.cu_seqlens.pin_memory(), p.max_len, p.width) for p in self.packing)
        return Batch(src, tgt_in, tgt_out, *packings)


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Batch:
    """Pairs of raw id sequences → `Batch`: src (B,S), tgt_in (B,T), tgt_out (B,T) int64,
    right-padded, with their packings.

    src = ids + [EOS] (`pad_sources`); tgt_in = [BOS] + ids; tgt_out = ids + [EOS].
    """
    src_lengths = [len(s) + 1 for s, _ in pairs]  # real tokens per row, EOS included
    tgt_lengths = [len(t) + 1 for _, t in pairs]  # BOS (tgt_in) or EOS (tgt_out) included
    t_len = max(tgt_lengths)
    targets = [t for _, t in pairs]
    tgt_in = torch.from_numpy(id_matrix(targets, t_len, first=BOS_ID))
    tgt_out = torch.from_numpy(id_matrix(targets, t_len, last=EOS_ID))
    src = pad_sources([s for s, _ in pairs])
    src_packing = packing_from_lengths(src_lengths, src.size(1))
    return Batch(src, tgt_in, tgt_out, src_packing, packing_from_lengths(tgt_lengths, t_len))


def load_batch(dataset: PairDataset, indices: np.ndarray) -> Batch:
    """Read the pairs of one batch from a (memory-mapped) dataset and collate them."""
    return collate([dataset.pair(int(i)) for i in indices])


class Prefetcher(Generic[T]):
    """The items of `source` in order, made up to `depth` ahead by a background (daemon) thread.

    ``next()`` waits for the next item, or re-raises what `source` raised (every later call too);
    `close()` stops the thread, which then makes at most the item it is on. Made for batch building,
    whose NumPy reads and small torch ops mostly leave the interpreter lock to the training thread.
    """

    def __init__(self, source: Iterator[T], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth {depth} < 1")
        self._queue: queue.Queue[tuple[T | None, BaseException | None]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(source,), name="nmt-prefetch", daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put((item, None)):
                    return
        except BaseException as e:  # noqa: BLE001 — handed to the consumer, raised there
            self._put((None, e))
            return
        self._put((None, StopIteration()))

    def _put(self, entry: tuple[T | None, BaseException | None]) -> bool:
        """Queue `entry` unless closed meanwhile (False)."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._error is None:
            item, self._error = self._queue.get()
            if self._error is None:
                return item  # type: ignore[return-value]
        raise self._error

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def padding_fraction(*tensors: torch.Tensor) -> tuple[int, int]:
    """(pad slots, all slots) over the given id tensors."""
    pads = sum(int((t == PAD_ID).sum()) for t in tensors)
    return pads, sum(t.numel() for t in tensors)

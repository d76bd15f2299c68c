"""Token-budget batches from length-sorted buckets, sharded over ranks; collate.

A batch's padded size is ``n_sentences * max(longest src + 1, longest tgt + 1)`` (the +1 is
the EOS on the source/target and the BOS on the decoder input) and never exceeds
``max_tokens``. Batches are formed once, greedily, over pairs sorted by (src_len, tgt_len)
(ties broken by a seeded permutation), so each batch holds similar lengths and padding is
small. Every epoch the batch *order* is shuffled with ``seed + epoch``; every kept pair is
seen exactly once per epoch. Pairs with a side longer than ``max_len`` are skipped and
counted.

With ``world_size`` ranks each rank takes every ``world_size``-th batch of the shuffled
order; the remainder (fewer than ``world_size`` batches) is dropped for that epoch so that
every rank runs the same number of steps (no rank waits forever in a collective). Which
batches are dropped changes with the epoch's shuffle.

`collate` makes a `Batch`: the padded id tensors plus, for each side, a `Packing` (where the real
tokens are, cu_seqlens, the longest length) computed here on the host from the sentence lengths, so
that the flash attention backend never reads them back from the device, nor training its token
counts (`Batch.real_tokens`). `Prefetcher` builds batches ahead in a background thread (training on
a GPU, with `Batch.pin_memory` for copies that do not wait).
"""

from __future__ import annotations

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


class PairDataset(Protocol):
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int: ...
    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


class TokenBatchSampler:
    """Fixed token-budget batches; per-epoch shuffled order; per-rank shards.

    Args:
        src_lengths, tgt_lengths: (N,) pieces per sentence, without BOS/EOS.
        max_tokens: budget for ``n_sentences * (longest side + 1)``.
        max_len: pairs with a side longer than this are skipped (counted in ``skipped``).
        seed: fixes tie-breaking within equal lengths and the per-epoch shuffles.
        rank, world_size: this process's shard.
        shuffle: shuffle batch order per epoch (off for validation).
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
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        src = np.asarray(src_lengths, dtype=np.int64)
        tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if src.shape != tgt.shape:
            raise NmtError(f"source and target have different sentence counts ({len(src)} vs {len(tgt)})")
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.rank, self.world_size = rank, world_size
        limit = min(max_len, max_tokens - 1)  # a pair must fit in a batch of one
        keep = (src <= limit) & (tgt <= limit)
        self.skipped = int((~keep).sum())
        self.batches = _make_batches(src, tgt, keep, max_tokens, seed)
        if len(self.batches) < world_size:
            raise NmtError(
                f"only {len(self.batches)} batch(es) for {world_size} ranks: the training split is too small"
            )
        self.real_tokens = int(sum((src[b] + tgt[b]).sum() + 2 * len(b) for b in self.batches))
        self.padded_tokens = int(sum(len(b) * (src[b].max() + tgt[b].max() + 2) for b in self.batches))

    @property
    def kept(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def padding_waste(self) -> float:
        """Fraction of the collated src + tgt_out slots over all batches that are padding."""
        return 1.0 - self.real_tokens / max(self.padded_tokens, 1)

    def __len__(self) -> int:
        """Batches this rank gets per epoch."""
        return len(self.batches) // self.world_size

    def epoch_order(self, epoch: int) -> list[np.ndarray]:
        """All batches of `epoch` in order, before sharding (every kept pair once)."""
        if not self.shuffle:
            return list(self.batches)
        order = np.random.default_rng(self.seed + epoch).permutation(len(self.batches))
        return [self.batches[i] for i in order]

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch` (same count on every rank)."""
        order = self.epoch_order(epoch)
        usable = len(self) * self.world_size
        return order[self.rank : usable : self.world_size]

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of `epoch` from batch index `start` (resuming mid-epoch)."""
        yield from self.epoch_batches(epoch)[start:]


def _make_batches(src: np.ndarray, tgt: np.ndarray, keep: np.ndarray, max_tokens: int, seed: int) -> list[np.ndarray]:
    """Greedy batches over kept indices sorted by (src_len, tgt_len), ties in seeded order."""
    idx = np.random.default_rng(seed).permutation(len(src))
    idx = idx[keep[idx]]
    idx = idx[np.lexsort((tgt[idx], src[idx]))]  # stable: primary src, then tgt
    sizes = np.maximum(src[idx], tgt[idx]) + 1
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    for pos in range(len(idx)):
        grown = max(longest, int(sizes[pos]))
        if pos > start and (pos - start + 1) * grown > max_tokens:
            batches.append(idx[start:pos])
            start, grown = pos, int(sizes[pos])
        longest = grown
    if start < len(idx):
        batches.append(idx[start:])
    return batches


def pad_sources(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """THE padded source batch: (B, S) int64, each sequence + EOS, right-padded with PAD_ID.

    S is the longest sequence + 1. Used by training (`collate`), validation and every
    decoding engine."""
    src = torch.full((len(seqs), max(len(s) for s in seqs) + 1), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        src[i, len(s)] = EOS_ID
    return src


def length_groups(lengths: Sequence[int], min_rows: int = 4, ratio: float = 0.75) -> list[list[int]]:
    """Rows of a padded batch in groups of similar length, to run separately where padding costs.

    Rows are taken longest first; a group closes when it has at least `min_rows` rows and the next
    row is shorter than `ratio` times the group's longest. One group (every row) when nothing is
    gained. Returns lists of row indices, each longest first.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) < min_rows or lengths[i] >= ratio * lengths[groups[-1][0]]):
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) > 1 and len(groups[-1]) < min_rows:  # a short tail joins the group before it
        groups[-2].extend(groups.pop())
    return groups


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
    n = len(pairs)
    src_lengths = [len(s) + 1 for s, _ in pairs]  # real tokens per row, EOS included
    tgt_lengths = [len(t) + 1 for _, t in pairs]  # BOS (tgt_in) or EOS (tgt_out) included
    t_len = max(tgt_lengths)
    tgt_in = torch.full((n, t_len), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((n, t_len), PAD_ID, dtype=torch.long)
    for i, (_, t) in enumerate(pairs):
        t_ids = torch.as_tensor(np.asarray(t, dtype=np.int64))
        tgt_in[i, 0] = BOS_ID
        tgt_in[i, 1 : len(t_ids) + 1] = t_ids
        tgt_out[i, : len(t_ids)] = t_ids
        tgt_out[i, len(t_ids)] = EOS_ID
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

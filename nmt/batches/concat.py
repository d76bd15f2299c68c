"""Concatenation augmentation of the training pairs (``train.concat_pairs``; Nguyen, Murray &
Chiang, IWSLT 2021, "Data Augmentation by Concatenation for Low-Resource Translation: A Mystery
and a Solution").

Models trained on short pairs stop early on longer inputs: on Tatoeba the output/reference
length ratio falls as the reference grows (docs/BENCHMARKS.md). Training on pairs joined two at
a time shows the model longer inputs and sentence boundaries inside a line, for no extra data.

`ConcatenatedPairs` wraps the training split: window k (a shard of the encoded split, see
`nmt.batches.batching.LengthWindows`) keeps its n pairs at their indices and is followed by
floor(n * fraction) joined pairs, each the source pieces of two distinct pairs of the same window
one after the other and their target pieces likewise (a SentencePiece line starts with the
word-start mark, so the two decode with a space between). The partners are drawn once from
(train.seed, window), so every epoch, rank and resumed run sees the same joined pairs, and the
sampler batches them by their lengths like any other pair (one over ``train.max_len`` is skipped).
Validation, test and decoding read the split itself.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from nmt.errors import NmtError

_SALT = 0xC0CA7  # keeps the partner draws apart from the sampler's (seed, window) streams
_KEPT = 2  # windows whose partner arrays are kept (the loader and a prefetch thread)


class ConcatenatedPairs:
    """`dataset` (a `LengthWindows` with `pair(i)`) with joined pairs after each window's own.

    Args:
        dataset: the training split (`nmt.data.encoded.ParallelSplit` or alike).
        fraction: joined pairs per window as a fraction of its pairs, in (0, 1].
        seed: train.seed; the same seed gives the same partners.
    """

    def __init__(self, dataset, fraction: float, seed: int) -> None:
        if not 0 < fraction <= 1:
            raise NmtError(f"train.concat_pairs: {fraction} must be in (0, 1]")
        self.dataset, self.seed = dataset, seed
        self.base = np.asarray(dataset.window_bounds(), dtype=np.int64)  # (S+1,) the split's own bounds
        own = np.diff(self.base)
        self.extra = np.where(own >= 2, np.floor(own * fraction), 0).astype(np.int64)  # (S,)
        self.bounds = np.concatenate(([0], np.cumsum(own + self.extra)))  # (S+1,)
        self._partners: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def window_bounds(self) -> np.ndarray:
        """(S+1,) int64: window k holds pairs bounds[k]:bounds[k+1], its own first."""
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) pieces of window k's pairs, joined ones last (without BOS/EOS)."""
        src, tgt = self.dataset.window_lengths(k)
        a, b = self.partners(k)
        return np.concatenate((src, src[a] + src[b])), np.concatenate((tgt, tgt[a] + tgt[b]))

    def partners(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(first, second): window k's joined pair j is its own pairs first[j] and second[j]
        (offsets in the window, distinct), each (extra[k],) int64, drawn from (seed, k)."""
        with self._lock:
            if k in self._partners:
                self._partners.move_to_end(k)
                return self._partners[k]
            n, m = int(self.base[k + 1] - self.base[k]), int(self.extra[k])
            rng = np.random.default_rng((self.seed, k, _SALT))
            first = rng.integers(0, n, m) if m else np.zeros(0, dtype=np.int64)
            second = (first + rng.integers(1, n, m)) % n if m else first  # never first itself
            self._partners[k] = first, second
            while len(self._partners) > _KEPT:
                self._partners.popitem(last=False)
            return first, second

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, tgt) ids of pair i, no BOS/EOS: a pair of the split, or two of them joined."""
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} out of range ({len(self)} with joined pairs)")
        k = int(np.searchsorted(self.bounds, i, side="right")) - 1
        j = i - int(self.bounds[k])
        own = int(self.base[k + 1] - self.base[k])
        if j < own:
            return self.dataset.pair(int(self.base[k]) + j)
        first, second = self.partners(k)
        a = self.dataset.pair(int(self.base[k] + first[j - own]))
        b = self.dataset.pair(int(self.base[k] + second[j - own]))
        return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))

"""Subword regularisation of the training pairs (``train.subword_alpha``; Kudo, 2018, "Subword
Regularization: Improving Neural Network Translation Models with Multiple Subword Candidates").

Training reads pre-encoded pieces (`nmt.data.encoded`), segmented once, the best way. With
sampling on, each training pair's pieces are turned back into text with its side's SentencePiece
model and encoded again with ``enable_sampling=True, alpha=train.subword_alpha, nbest_size=-1``:
a segmentation drawn from the whole lattice (unigram: smaller alpha, more varied; a BPE model
reads alpha as BPE-dropout's probability instead). Both sides are resampled; validation, test and
decoding keep the best segmentation (they read their batches elsewhere).

Determinism: SentencePiece draws from a generator seeded by `spm.set_random_generator_seed`;
each pair is encoded right after that seed is set to a hash of (train.seed, epoch, pair index),
under a lock, so a pair's segmentation depends only on those: the same in the prefetching
thread and on the loop's own, and in a resumed run.

Kept as stored: a pair holding an ``<unk>`` piece (its text would not encode back to it) and a
pair whose resampled side grows past ``train.max_len`` pieces (the batch sampler batched it by its
stored lengths). A sampled segmentation is usually longer and its length varies from pair to
pair, so with sampling on a batch holds more than ``train.max_tokens`` and more padding: the
batch sampler grouped its pairs by their stored lengths.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.errors import NmtError

Pair = tuple[Sequence[int], Sequence[int]]
_SEED_LOCK = threading.Lock()  # SentencePiece's seed is process-wide: seed and encode together


def pair_seed(seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed for pair `index` in `epoch` (a multiplicative hash; distinct per epoch)."""
    return (seed * 0x9E3779B1 + (epoch + 1) * 0x85EBCA77 + index * 0xC2B2AE3D) % 2**32


class Resegmenter:
    """Gives training pairs a segmentation drawn by subword sampling (see the module docstring);
    it draws pieces, not pairs or batches (those are `nmt.batches.batching.WindowSampler`'s)."""

    def __init__(self, src_model: Path, tgt_model: Path, alpha: float, seed: int, max_len: int) -> None:
        for path in (src_model, tgt_model):
            if not Path(path).is_file():
                raise NmtError(f"train.subword_alpha: {path}: SentencePiece model not found (run `nmt vocab`)")
        self.sides = [spm.SentencePieceProcessor(model_file=str(p)) for p in (src_model, tgt_model)]
        self.alpha, self.seed, self.max_len = alpha, seed, max_len

    def resegment(self, indices: Sequence[int], pairs: Sequence[Pair], epoch: int) -> list[Pair]:
        """`pairs` (the pairs of training indices `indices`, stored pieces) with sampled pieces."""
        return [self._pair(int(i), p, epoch) for i, p in zip(indices, pairs, strict=True)]

    def _pair(self, index: int, pair: Pair, epoch: int) -> Pair:
        if any(UNK_ID in np.asarray(ids) for ids in pair):
            return pair
        texts = [sp.decode([int(t) for t in ids]) for sp, ids in zip(self.sides, pair, strict=True)]
        with _SEED_LOCK:
            spm.set_random_generator_seed(pair_seed(self.seed, epoch, index))
            sampled = [
                sp.encode(text, out_type=int, enable_sampling=True, alpha=self.alpha, nbest_size=-1)
                for sp, text in zip(self.sides, texts, strict=True)
            ]
        if any(len(ids) > self.max_len for ids in sampled):
            return pair
        return sampled[0], sampled[1]

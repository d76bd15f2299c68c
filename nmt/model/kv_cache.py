"""The state of incremental decoding: what `Transformer.decode_step` reads and appends to.

Rows and sentences. A decoding batch has N sentences and `beam` rows per sentence (1 for
greedy search), R = N * beam rows in all; row r belongs to sentence r // beam. What depends only
on the source — the cross-attention K/V of every decoder layer and the source padding — is kept
once per *sentence*: the beams of a sentence are its queries in one small matmul, and moving
beams never copies it. What depends on the generated prefix — the self-attention K/V — is kept
per *row* in a `KVCache`.

`KVCache` holds the self-attention keys and values of all decoder layers in one tensor
(L, 2, R, H, C, dk): K at index 0, V at 1, room for C positions of which the first `length` are
written. A step writes its position in place (no concatenation); when the room is used up the
cache moves to a buffer with twice the room. Selecting rows (dropping finished sentences,
moving beams) copies the written positions into the second of two reused flat buffers, sized
for exactly one more position, so that after a beam step the next step reads contiguous K/V and
nothing is allocated in the steady state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

INITIAL_ROOM = 16  # positions allocated at the first step; doubled when used up


class KVCache:
    """Self-attention K/V of every decoder layer for R rows, written one position per step.
    Inference only: the cache keeps no autograd history."""

    def __init__(self, layers: int, rows: int) -> None:
        self.layers, self.rows = layers, rows
        self.kv: Tensor | None = None  # (L, 2, R, H, C, dk); allocated at the first append
        self._pool: list[Tensor] = []  # two flat buffers; `kv` is a view of one of them

    @torch.no_grad()
    def append(self, layer: int, t: int, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Write position `t` of `layer`: kv (R, 2, H, dk) → K, V views (R, H, t+1, dk) of positions 0..t."""
        cache = self.room(t, kv)
        cache[layer, :, :, :, t].copy_(kv.transpose(0, 1))  # (2, R, H, dk)
        return cache[layer, 0, :, :, : t + 1], cache[layer, 1, :, :, : t + 1]

    def room(self, t: int, like: Tensor) -> Tensor:
        """The cache (L, 2, R, H, C, dk) with room for position `t` (moved to a buffer with twice
        the room when it is used up); `like`: a step's K/V (R, 2, H, dk), for dtype, H and dk."""
        if self.kv is None or self.kv.size(4) <= t:
            self._move(torch.arange(self.rows, device=like.device), t, 2 * (t + 1), like)
        assert self.kv is not None
        return self.kv

    @torch.no_grad()
    def select(self, rows: Tensor, t: int) -> None:
        """Keep rows `rows` (R',) of the first `t` positions, in that order (repeats expand)."""
        if self.kv is None or t == 0:
            self.kv, self.rows = None, rows.numel()
            return
        self._move(rows, t, t + 1, self.kv)

    def views(self, t: int) -> tuple[list[Tensor], list[Tensor]]:
        """Per layer K and V views (R, H, t, dk) of the first `t` positions (empty before the first step)."""
        if self.kv is None:
            return [], []
        layers = range(self.layers)
        return [self.kv[i, 0, :, :, :t] for i in layers], [self.kv[i, 1, :, :, :t] for i in layers]

    def _move(self, rows: Tensor, t: int, room: int, like: Tensor) -> None:
        """Copy rows `rows` of positions < t into the spare buffer, shaped with `room` positions.
        `like` is the current cache (L, 2, R, H, C, dk) or a step's K/V (R, 2, H, dk): dtype, H, dk."""
        H, dk = (like.size(3), like.size(5)) if like.dim() == 6 else (like.size(-2), like.size(-1))
        shape = (self.layers, 2, rows.numel(), H, room, dk)
        target = self._spare(shape, like)
        if self.kv is not None and t > 0:
            torch.index_select(self.kv[:, :, :, :, :t], 2, rows, out=target[:, :, :, :, :t])
        self.kv, self.rows = target, rows.numel()

    def _spare(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A view `shape` of the pool buffer that does not hold `self.kv`, grown if too small."""
        need = 1
        for n in shape:
            need *= n
        busy = self.kv.data_ptr() if self.kv is not None else None
        free = [i for i, b in enumerate(self._pool) if b.data_ptr() != busy]
        i = free[0] if free else len(self._pool)
        if i == len(self._pool):
            self._pool.append(like.new_empty(0))
        if self._pool[i].numel() < need or self._pool[i].dtype != like.dtype:
            self._pool[i] = like.new_empty(need + need // 4)  # some slack for longer prefixes
        return self._pool[i][:need].view(shape)


@dataclass
class DecoderState:
    """Everything `decode_step` needs for N sentences × `beam` rows (see the module docstring)."""

    cross_k: list[Tensor]  # per decoder layer (N, H, S, dk), computed once
    cross_v: list[Tensor]
    src_pad: Tensor  # (N, S) bool, True = padding
    cross_bias: Tensor | None  # (N, 1, 1, S) in the model's dtype, added to cross-attention scores: 0 real,
    # finfo.min padding; None where no source has padding
    cross_empty: Tensor | None  # (N, 1, 1, 1): 0 for a source without any real token, else 1; None: none is
    self_kv: KVCache
    step: int = 0  # tokens decoded so far = position of the next token
    beam: int = 1  # rows per sentence

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        """Row r of the new state is row `rows[r]` of the old one, in place.

        - `beam`: rows per sentence from now on (expanding B rows to B × beam at the first beam step:
          ``rows = arange(B).repeat_interleave(beam)``); default unchanged.
        - `sentences` (N',): the old sentences kept, in order, when sentences are dropped; the new
          rows must belong to them in the same order (``rows[r] // old_beam == sentences[r // beam]``).
        - neither: with one row per sentence, `rows` selects sentences too (drop, permute, repeat);
          with beams, rows only move among the beams of their sentence and the source side stays.
        """
        new_beam = self.beam if beam is None else beam
        if sentences is None and self.beam == 1 and new_beam == 1:
            sentences = rows
        if sentences is not None:
            self.cross_k = [t.index_select(0, sentences) for t in self.cross_k]
            self.cross_v = [t.index_select(0, sentences) for t in self.cross_v]
            self.src_pad = self.src_pad.index_select(0, sentences)
            if self.cross_bias is not None:
                self.cross_bias = self.cross_bias.index_select(0, sentences)
            if self.cross_empty is not None:
                self.cross_empty = self.cross_empty.index_select(0, sentences)
        self.self_kv.select(rows, self.step)
        self.beam = new_beam

    @property
    def batch_size(self) -> int:
        """Rows (sentences × beam)."""
        return self.self_kv.rows

    @property
    def self_k(self) -> list[Tensor]:
        """Per layer cached self-attention keys (R, H, step, dk) (empty list before the first step)."""
        return self.self_kv.views(self.step)[0]

    @property
    def self_v(self) -> list[Tensor]:
        return self.self_kv.views(self.step)[1]

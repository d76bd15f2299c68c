"""Boolean masks for attention. Padding is on the right.

Two conventions, never mixed:
- key-padding masks are (B, S) with True = padding (ignore this position);
- attention masks are broadcastable to (B, heads, T_query, T_key) with True = may attend,
  the convention of `torch.nn.functional.scaled_dot_product_attention`.

`Packing` describes the same right padding the way the packed (varlen) flash attention needs it:
where the real tokens are, int32 cu_seqlens and the longest length. The batch builder
(`nmt.batches.batching.collate`) computes it on the host from the lengths it already knows, so that
no attention call has to read them back from the device.

`length_groups` splits the rows of a padded batch into groups of similar length, for the work
(the encoder of a decoding batch) where padding costs more than a second call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt import PAD_ID


def padding_mask(tokens: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """(B, S) token ids → (B, S) bool, True where the token is padding."""
    return tokens.eq(pad_id)


def lengths_to_padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """(B,) lengths → (B, max_len) bool, True at positions >= the row's length."""
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] >= lengths[:, None]  # (B, S)


def causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """(T, T) bool, True where query i may attend key j, i.e. j <= i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def attention_mask_from_padding(key_pad: Tensor) -> Tensor:
    """(B, S) key padding (True = pad) → (B, 1, 1, S) attention mask (True = may attend)."""
    return ~key_pad[:, None, None, :]


def decoder_self_mask(tgt_pad: Tensor) -> Tensor:
    """(B, T) target padding → (B, 1, T, T) causal AND key-not-padding (True = may attend)."""
    T = tgt_pad.size(1)
    return causal_mask(T, tgt_pad.device)[None, None] & attention_mask_from_padding(tgt_pad)  # (B, 1, T, T)


def cross_attention_bias(key_pad: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(B, S) key padding → (B, 1, 1, S) additive mask in `dtype` (the queries') for incremental
    decoding: 0 where a key may be attended, the most negative finite value at padding (softmax
    gives it weight 0, never NaN)."""
    bias = torch.zeros(key_pad.shape, dtype=dtype, device=key_pad.device)
    return bias.masked_fill_(key_pad, torch.finfo(dtype).min)[:, None, None, :]


@dataclass(frozen=True, eq=False)
class Packing:
    """Where the real tokens of a right-padded (B, L) batch are, for packed (varlen) attention."""

    index: Tensor  # (N,) int64: flat positions b * width + i of the N real tokens, row-major
    cu_seqlens: Tensor  # (B+1,) int32: row b's tokens are packed rows cu_seqlens[b]:cu_seqlens[b+1]
    max_len: int  # the longest row's length, a host int (the kernel needs it; reading it back would sync)
    width: int  # L, the padded width the index refers to

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Packing:
        """The same packing with its tensors on `device` (from pinned host memory the copy is
        asynchronous); `max_len` and `width` stay host ints."""
        index = self.index.to(device, non_blocking=non_blocking)
        cu = self.cu_seqlens.to(device, non_blocking=non_blocking)
        return Packing(index, cu, self.max_len, self.width)


def packing_from_lengths(lengths: list[int], width: int) -> Packing:
    """Host-side `Packing` (CPU tensors) of a batch whose row b has `lengths[b]` real tokens
    followed by padding up to `width`; what `lengths_to_padding_mask` describes as a mask."""
    if any(n < 0 or n > width for n in lengths):
        raise ValueError(f"lengths {lengths} do not fit a padded width of {width}")
    n = torch.tensor(lengths, dtype=torch.int64).reshape(-1)  # (B,)
    real = torch.arange(width)[None, :] < n[:, None]  # (B, L)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = n.cumsum(0)
    return Packing(real.flatten().nonzero().squeeze(1), cu, max(lengths, default=0), width)


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

"""Boolean masks for attention. Padding is on the right.

Two conventions, never mixed:
- key-padding masks are (B, S) with True = padding (ignore this position);
- attention masks are broadcastable to (B, heads, T_query, T_key) with True = may attend,
  the convention of `torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

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


def cross_attention_bias(key_pad: Tensor) -> Tensor:
    """(B, S) key padding → (B, 1, 1, S) fp32 additive mask for incremental decoding: 0 where a key
    may be attended, the most negative fp32 value at padding (softmax gives it weight 0, never NaN)."""
    bias = torch.zeros(key_pad.shape, dtype=torch.float32, device=key_pad.device)
    return bias.masked_fill_(key_pad, torch.finfo(torch.float32).min)[:, None, None, :]

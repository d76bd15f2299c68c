"""Values of each mask function on small examples."""

from __future__ import annotations

import torch

from nmt import PAD_ID
from nmt.model.masks import (
    attention_mask_from_padding,
    causal_mask,
    decoder_self_mask,
    lengths_to_padding_mask,
    padding_mask,
)

T, F = True, False


def test_padding_mask_marks_pad_tokens():
    tokens = torch.tensor([[5, 6, 3], [7, 3, PAD_ID], [3, PAD_ID, PAD_ID]])
    expected = torch.tensor([[F, F, F], [F, F, T], [F, T, T]])
    assert torch.equal(padding_mask(tokens, PAD_ID), expected)
    assert torch.equal(padding_mask(torch.tensor([[9, 9]]), pad_id=9), torch.tensor([[T, T]]))


def test_lengths_to_padding_mask():
    mask = lengths_to_padding_mask(torch.tensor([3, 1, 0]), max_len=4)
    expected = torch.tensor([[F, F, F, T], [F, T, T, T], [T, T, T, T]])
    assert torch.equal(mask, expected)
    assert lengths_to_padding_mask(torch.tensor([2, 5])).shape == (2, 5)  # max_len defaults to the longest


def test_causal_mask_allows_past_and_present_only():
    expected = torch.tensor([[T, F, F], [T, T, F], [T, T, T]])
    assert torch.equal(causal_mask(3), expected)
    assert causal_mask(3, device="cpu").dtype == torch.bool


def test_attention_mask_from_padding_inverts_and_broadcasts():
    key_pad = torch.tensor([[F, F, T], [F, T, T]])
    mask = attention_mask_from_padding(key_pad)
    assert mask.shape == (2, 1, 1, 3)
    assert torch.equal(mask[:, 0, 0], torch.tensor([[T, T, F], [T, F, F]]))


def test_decoder_self_mask_combines_causal_and_padding():
    tgt_pad = torch.tensor([[F, F, F], [F, F, T]])
    mask = decoder_self_mask(tgt_pad)
    assert mask.shape == (2, 1, 3, 3)
    assert torch.equal(mask[0, 0], torch.tensor([[T, F, F], [T, T, F], [T, T, T]]))
    assert torch.equal(mask[1, 0], torch.tensor([[T, F, F], [T, T, F], [T, T, F]]))

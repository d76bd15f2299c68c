"""Values of each mask function on small examples."""

from __future__ import annotations

import torch

from nmt import PAD_ID
from nmt.model.masks import (
    attention_mask_from_padding,
    causal_mask,
    decoder_self_mask,
    length_groups,
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


def test_length_groups_split_mixed_lengths_and_keep_even_ones_whole():
    mixed = [3, 30, 9, 12, 28, 4, 10, 29, 3, 11, 27, 5]
    groups = length_groups(mixed)
    assert sorted(i for g in groups for i in g) == list(range(len(mixed)))  # every row once
    assert [[mixed[i] for i in g] for g in groups] == [[30, 29, 28, 27], [12, 11, 10, 9], [5, 4, 3, 3]]
    assert length_groups([10, 9, 10, 8, 9, 10, 9, 8]) == [[0, 2, 5, 1, 4, 6, 3, 7]]  # nothing to gain: one group


def test_length_groups_never_leave_a_group_below_min_rows():
    groups = length_groups([40, 2, 38, 39, 37, 36, 3], min_rows=4)  # the two short rows join the long group
    assert len(groups) == 1 and len(groups[0]) == 7
    for lengths in ([1], [5, 1], list(range(1, 30)), [50] * 3 + [1] * 9):
        groups = length_groups(lengths, min_rows=3)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert len(groups) == 1 or min(len(g) for g in groups) >= 3
        for g in groups:
            assert [lengths[i] for i in g] == sorted((lengths[i] for i in g), reverse=True)

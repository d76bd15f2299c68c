"""Source rows read from the target table while training (nmt/model/shared_rows.py)."""

from __future__ import annotations

import torch
from torch import nn

from nmt import PAD_ID
from nmt.model.shared_rows import SharedRowsEmbedding, share_rows

PAIRS = torch.tensor([[4, 7], [5, 4], [9, 7]])  # (source id, target id); two sources share target 7


class Pair(nn.Module):
    """The two tables of a Transformer, as `share_rows` finds them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.src_embed = nn.Embedding(12, 6, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(10, 6, padding_idx=PAD_ID)


def test_a_lookup_reads_shared_rows_from_the_target_table_and_the_rest_from_its_own():
    model = Pair()
    own = model.src_embed.weight.detach().clone()
    shared = share_rows(model, PAIRS)
    out = model.src_embed(torch.tensor([[4, 5, 9, 6, PAD_ID]]))[0]  # (5, D)
    target = model.tgt_embed.weight
    assert torch.equal(out[0], target[7]) and torch.equal(out[1], target[4]) and torch.equal(out[2], target[7])
    assert torch.equal(out[3], own[6]) and not out[4].any()
    assert isinstance(shared, SharedRowsEmbedding) and model.src_embed is shared


def test_a_shared_row_learns_in_the_target_table_only():
    model = Pair()
    share_rows(model, PAIRS)
    model.src_embed(torch.tensor([[4, 6, 9]])).sum().backward()
    src_grad, tgt_grad = model.src_embed.weight.grad, model.tgt_embed.weight.grad
    assert not src_grad[[4, 9]].any() and src_grad[6].abs().sum() > 0  # 6 is not shared
    assert torch.allclose(tgt_grad[7], torch.full((6,), 2.0))  # read twice: by 4 and by 9


def test_the_state_dict_and_parameters_are_those_of_the_plain_model():
    plain, model = Pair(), Pair()
    share_rows(model, PAIRS)
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]


def test_sync_after_a_step_leaves_a_whole_ordinary_source_table():
    model = Pair()
    shared = share_rows(model, PAIRS)
    assert torch.equal(model.src_embed.weight[[4, 5, 9]], model.tgt_embed.weight[[7, 4, 7]])  # synced at once
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.register_step_post_hook(lambda *_: shared.sync())
    model.src_embed(torch.tensor([[4, 5, 6, 9]])).pow(2).sum().backward()
    before = model.tgt_embed.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(model.tgt_embed.weight[7], before[7])  # it learnt
    plain = nn.Embedding(12, 6, padding_idx=PAD_ID)  # what a checkpoint loads into at decoding
    plain.load_state_dict({"weight": model.state_dict()["src_embed.weight"]})
    ids = torch.tensor([[4, 5, 6, 9]])
    assert torch.equal(plain(ids), model.src_embed(ids))

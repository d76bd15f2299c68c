"""Token rows padded to a bucket before the linear layers (`nmt.model.row_buckets`): the same
outputs and gradients, and matmuls that see only bucketed row counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt import PAD_ID
from nmt.config import ModelConfig
from nmt.model.row_buckets import bucketed, padded_rows, row_buckets
from nmt.model.transformer import Transformer

V = 40


def test_padded_rows():
    assert [padded_rows(r, 8) for r in (1, 8, 9, 21)] == [8, 8, 16, 24]
    assert padded_rows(21, 0) == 21 and padded_rows(21, 1) == 21


def test_bucketed_linear_gives_the_same_rows_and_gradients():
    torch.manual_seed(0)
    layer = nn.Linear(16, 12)
    x = torch.randn(3, 7, 16, requires_grad=True)  # 21 rows
    seen = []
    layer.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
    plain = layer(x)
    grads = torch.autograd.grad(plain.square().sum(), [x, layer.weight, layer.bias])
    with row_buckets(8):
        out = bucketed(layer, x)
    again = torch.autograd.grad(out.square().sum(), [x, layer.weight, layer.bias])
    assert seen == [(3, 7, 16), (24, 16)]
    assert out.shape == (3, 7, 12) and torch.allclose(out, plain, atol=1e-6)
    for a, b in zip(again, grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_outside_the_context_the_input_goes_through_untouched():
    x = torch.randn(5, 3)
    assert bucketed(lambda t: t, x) is x
    with row_buckets(4):
        assert bucketed(lambda t: t, x[:4]).shape == (4, 3)  # already a multiple: no copy needed
    with row_buckets(0):
        assert bucketed(lambda t: t, x) is x


def test_every_linear_of_a_training_step_sees_bucketed_rows_and_the_loss_is_unchanged(monkeypatch):
    cfg = ModelConfig(d_model=32, heads=4, encoder_layers=2, decoder_layers=2, ffn_dim=64, max_positions=64,
                      dropout=0.1, attention="math")  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg, V, V).train()
    src, tgt = torch.randint(4, V, (3, 7)), torch.randint(4, V, (3, 5))
    src[2, 4:], tgt[1, 3:] = PAD_ID, PAD_ID
    keep = tgt != PAD_ID

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(1)  # the same dropout masks in both runs
        model.zero_grad()
        loss = F.cross_entropy(model(src, tgt, keep), tgt[keep])
        loss.backward()
        return loss, [p.grad.clone() for p in model.parameters()]

    plain_loss, plain_grads = step()
    rows = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: rows.append(x.numel() // x.size(-1)) or real_linear(x, w, b))
    with row_buckets(16):
        loss, grads = step()
    assert rows and all(r % 16 == 0 for r in rows)
    assert torch.allclose(loss, plain_loss, atol=1e-6)
    for a, b in zip(grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("bucket", [0, 16])
def test_unbucketed_rows_would_fail_the_check(monkeypatch, bucket):
    """The check above can fail: without the context the rows are 21 and 15, not multiples of 16."""
    layer = nn.Linear(4, 4)
    rows = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: rows.append(x.numel() // x.size(-1)) or real_linear(x, w, b))
    with row_buckets(bucket):
        bucketed(layer, torch.randn(3, 7, 4))
        bucketed(layer, torch.randn(5, 3, 4))
    assert all(r % 16 == 0 for r in rows) == (bucket == 16)

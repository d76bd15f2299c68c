"""The training objective and the learning-rate schedules (nmt/train/objective.py):
label-smoothed NLL against PyTorch's cross-entropy and by hand; inverse-sqrt and cosine values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nmt import PAD_ID
from nmt.config import load_config
from nmt.errors import NmtError
from nmt.train.objective import (
    chunk_rows,
    label_smoothed_nll,
    learning_rate,
    lr_factor,
    projected_label_smoothed_nll,
)

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


def test_label_smoothing_matches_cross_entropy_and_ignores_pad():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(4, 11, (3, 5))
    target[0, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    for eps in (0.0, 0.1, 0.3):
        loss, nll, n = label_smoothed_nll(logits, target, eps)
        ref = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD_ID, label_smoothing=eps,
                              reduction="sum")  # fmt: skip
        assert n == int((target != PAD_ID).sum()) == 9
        torch.testing.assert_close(loss, ref)
        plain = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD_ID, reduction="sum")
        torch.testing.assert_close(nll, plain)


def test_label_smoothing_gradient_matches_cross_entropy_padded_and_packed():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 13)
    target = torch.randint(4, 13, (4, 6))
    target[1, 2:] = PAD_ID
    target[3, 5:] = PAD_ID
    keep = target != PAD_ID
    ref_in = logits.clone().requires_grad_()
    F.cross_entropy(ref_in.flatten(0, 1), target.flatten(), ignore_index=PAD_ID, label_smoothing=0.1,
                    reduction="sum").backward()  # fmt: skip
    padded_in = logits.clone().requires_grad_()
    label_smoothed_nll(padded_in, target, 0.1)[0].backward()
    packed_in = logits[keep].clone().requires_grad_()  # (N, V), what the trainer passes for a Transformer
    loss, nll, n = label_smoothed_nll(packed_in, target[keep], 0.1)
    (2.0 * loss).backward()
    assert n == int(keep.sum()) and not nll.requires_grad
    torch.testing.assert_close(padded_in.grad, ref_in.grad)
    torch.testing.assert_close(packed_in.grad, 2.0 * ref_in.grad[keep])


def test_chunk_rows_keep_a_chunk_near_a_million_logits():
    assert [chunk_rows(v) for v in (4000, 32000, 10, 1 << 21)] == [256, 32, 1024, 16]


@pytest.mark.parametrize("bucket", [0, 16])
def test_projected_loss_equals_the_loss_of_the_logits_in_chunks(monkeypatch, bucket):
    """The loss, NLL and both gradients of the chunked projection + loss equal those of the whole
    logits, over several chunks (the last one short) and with the rows padded to a bucket."""
    monkeypatch.setattr("nmt.train.objective.CHUNK_ELEMENTS", 16 * 50)  # 16 rows a chunk
    torch.manual_seed(0)
    h, w = torch.randn(37, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    target = torch.randint(1, 50, (37,))
    loss, nll, n = label_smoothed_nll(F.linear(h, w), target, 0.1, packed=True)
    grads = torch.autograd.grad(loss * 0.5, [h, w])
    loss2, nll2, n2 = projected_label_smoothed_nll(h, w, target, 0.1, bucket)
    grads2 = torch.autograd.grad(loss2 * 0.5, [h, w])
    assert n == n2 == 37 and not nll2.requires_grad
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(nll2, nll)
    for a, b in zip(grads2, grads, strict=True):
        torch.testing.assert_close(a, b)


def test_projected_loss_under_bf16_autocast_is_close_to_the_logits_path():
    torch.manual_seed(1)
    h, w = torch.randn(40, 16, requires_grad=True), torch.randn(300, 16, requires_grad=True)
    target = torch.randint(1, 300, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = label_smoothed_nll(F.linear(h, w), target, 0.1, packed=True)
        loss2, _, _ = projected_label_smoothed_nll(h, w, target, 0.1, 64)
    grads, grads2 = torch.autograd.grad(loss, [h, w]), torch.autograd.grad(loss2, [h, w])
    assert loss2.dtype == torch.float32
    torch.testing.assert_close(loss2, loss, rtol=1e-3, atol=1e-3)
    for a, b in zip(grads2, grads, strict=True):
        assert a.dtype == torch.float32  # the fp32 leaves get fp32 gradients
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)


def test_label_smoothing_by_hand():
    # one position, V = 4, logits log([0.1, 0.2, 0.3, 0.4]) → p exactly those; target id 3 (p = 0.4)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    loss, nll, n = label_smoothed_nll(p.log().view(1, 1, 4), torch.tensor([[3]]), 0.2)
    by_hand = 0.8 * -math.log(0.4) + 0.2 * -(math.log(0.1) + math.log(0.2) + math.log(0.3) + math.log(0.4)) / 4
    assert n == 1
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    assert nll.item() == pytest.approx(-math.log(0.4), rel=1e-6)


def test_inverse_sqrt_schedule_values():
    cfg = load_config(TINY, ["train.lr=0.002", "train.warmup=100", "train.schedule=inverse_sqrt"]).train
    assert learning_rate(1, cfg) == pytest.approx(0.002 / 100)
    assert learning_rate(50, cfg) == pytest.approx(0.001)
    assert learning_rate(100, cfg) == pytest.approx(0.002)  # peak
    assert learning_rate(400, cfg) == pytest.approx(0.001)  # 0.002 * sqrt(100/400)
    assert learning_rate(10_000, cfg) == pytest.approx(0.0002)


def test_cosine_schedule_values():
    over = ["train.lr=0.001", "train.min_lr=0.0001", "train.warmup=10", "train.schedule=cosine", "train.max_steps=110"]
    cfg = load_config(TINY, over).train
    assert learning_rate(5, cfg) == pytest.approx(0.0005)
    assert learning_rate(10, cfg) == pytest.approx(0.001)
    assert learning_rate(60, cfg) == pytest.approx(0.0001 + 0.0009 * 0.5)  # half-way: cos(pi/2) = 0
    assert learning_rate(110, cfg) == pytest.approx(0.0001)
    assert learning_rate(500, cfg) == pytest.approx(0.0001)
    with pytest.raises(NmtError, match="cosine"):
        lr_factor(5, load_config(TINY, ["train.schedule=cosine", "train.max_steps=0"]).train)

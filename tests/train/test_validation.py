"""Validation loss: every pair the model can take is scored (long ones included), the rest counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import ListDataset

from nmt import PAD_ID
from nmt.batches.batching import collate
from nmt.config import load_config
from nmt.model.transformer import build_model
from nmt.train.objective import label_smoothed_nll
from nmt.train.validation import Validator

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 30


Pairs = ListDataset  # a validation split in memory (the ParallelSplit interface)


@pytest.fixture
def setup(tmp_path):
    # train.max_len 8, model.max_positions 20: lengths 12 are longer than training takes but
    # fit the model; length 25 does not fit the model at all.
    config = load_config(ROOT / "configs" / "tiny.yaml", ["train.max_len=8", "model.max_positions=20"])
    rng = np.random.default_rng(0)
    lengths = [(3, 4), (5, 2), (12, 6), (4, 12), (6, 6), (25, 3)]
    pairs = [(rng.integers(4, VOCAB, a).tolist(), rng.integers(4, VOCAB, b).tolist()) for a, b in lengths]
    torch.manual_seed(0)
    model = build_model(config, VOCAB, VOCAB).eval()
    return config, Pairs(pairs), model, Validator(config, tmp_path, Pairs(pairs), torch.device("cpu"), precision="fp32")


def reference_loss(model, pairs, eps: float) -> tuple[float, float]:
    """Per-token (loss, nll), one pair at a time with full (B, T, V) logits."""
    loss = nll = n = 0.0
    with torch.no_grad():
        for s, t in pairs:
            src, tgt_in, tgt_out = collate([(s, t)])
            a, b, k = label_smoothed_nll(model(src, tgt_in), tgt_out, eps)
            loss, nll, n = loss + a.item(), nll + b.item(), n + k
    return loss / n, nll / n


def test_loss_covers_pairs_longer_than_train_max_len_and_counts_the_rest(setup):
    config, data, model, validator = setup
    assert (validator.pairs, validator.skipped) == (5, 1)  # only the 25-piece source is out of reach
    got = validator.loss(model)
    want = reference_loss(model, data.pairs[:5], config.train.label_smoothing)
    assert got == pytest.approx(want, rel=1e-5)
    without_long = reference_loss(model, [data.pairs[i] for i in (0, 1, 4)], config.train.label_smoothing)
    assert got != pytest.approx(without_long, rel=1e-5)  # the long pairs count


def test_loss_asks_the_model_for_real_target_positions_only(setup, monkeypatch):
    _, _, model, validator = setup
    seen: list[tuple[tuple[int, ...], int]] = []
    forward = model.forward

    def spy(src, tgt_in, keep=None):
        out = forward(src, tgt_in, keep)
        assert keep is not None, "validation computed logits on pad positions"
        seen.append((tuple(out.shape), int(keep.sum())))
        return out

    monkeypatch.setattr(model, "forward", spy)
    validator.loss(model)
    assert seen and all(shape[0] == kept and len(shape) == 2 for shape, kept in seen)  # (N, V)


def test_loss_hands_the_batches_host_packing_to_a_model_that_takes_it(setup, monkeypatch):
    """So that a flash backend never reads lengths back from the device during validation."""
    _, _, model, validator = setup
    seen: list[bool] = []
    forward = model.forward

    def spy(src, tgt_in, keep=None, *, packing=None):
        src_packing, tgt_packing = packing
        assert src_packing.cu_seqlens[-1] == int((src != PAD_ID).sum()) and src_packing.width == src.size(1)
        assert tgt_packing.width == tgt_in.size(1)
        seen.append(True)
        return forward(src, tgt_in, keep, packing=packing)

    monkeypatch.setattr(model, "forward", spy)
    validator.loss(model)
    assert seen


def test_run_reports_pairs_and_skipped(setup):
    _, _, model, validator = setup
    result = validator.run(model)
    assert (result["pairs"], result["skipped"]) == (5, 1)
    assert np.isfinite(result["loss"]) and result["ppl"] > 1
    assert all(isinstance(x, str) for sample in result["samples"] for x in sample)

"""The analytic FLOP counter against a hand computation and against torch's FLOP counter."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.config import ModelConfig
from nmt.model.flops import forward_flops, matmul_peak_flops, mfu, train_flops
from nmt.model.transformer import Transformer


def test_train_flops_hand_computed():
    cfg = ModelConfig(d_model=4, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=8)
    # D=4, F=8, V=10; 6 source positions attending over S=3 keys, 4 target positions over T=2.
    # encoder layer, per source token: 8*16 (Q,K,V,O) + 4*4*8 (FFN) + 4*3*4 (scores, sum) = 304; × 6 = 1824
    # decoder layer, per target token: 8*16 + 4*2*4 (self) + 4*16 (cross Q,O) + 4*3*4 (cross) + 4*4*8 = 400; × 4 = 1600
    # cross-attention K,V of the memory: 6 × 4*16 = 384;   output projection: 4 × 2*4*10 = 320
    forward = 1824 + 1600 + 384 + 320
    assert forward_flops(cfg, 6, 4, 3, 2, 10) == forward
    assert train_flops(cfg, 6, 4, 3, 2, 10) == 3 * forward == 12384


def test_train_flops_scales_with_layers():
    cfg = ModelConfig(d_model=4, heads=2, encoder_layers=2, decoder_layers=3, ffn_dim=8)
    # 2 encoder layers (2 × 1824), 3 decoder layers (3 × (1600 + 384)), one output projection (320)
    assert train_flops(cfg, 6, 4, 3, 2, 10) == 3 * (2 * 1824 + 3 * (1600 + 384) + 320)


@pytest.mark.parametrize("tie", [True, False])
def test_train_flops_equals_torch_flop_counter(tie):
    cfg = ModelConfig(
        d_model=32, heads=4, encoder_layers=2, decoder_layers=3, ffn_dim=48, dropout=0.0,
        max_positions=64, attention="math", tie_embeddings=tie,
    )  # fmt: skip
    model = Transformer(cfg, 50, 60)
    B, S, T = 3, 7, 5
    src, tgt = torch.randint(4, 50, (B, S)), torch.randint(4, 60, (B, T))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt).sum().backward()  # dense math backend: every padded position is computed
    assert counter.get_total_flops() == train_flops(cfg, B * S, B * T, S, T, 60)


def test_matmul_peak_flops_is_a_positive_rate():
    rate = matmul_peak_flops(torch.float32, n=128, repeats=2, device="cpu")
    assert math.isfinite(rate) and 1e6 < rate < 1e15


def test_training_peak_is_measured_once_per_host_in_the_runs_precision(monkeypatch, tmp_path):
    from nmt.hw import host
    from nmt.model import flops

    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path))
    host.forget()
    calls = []

    def fake_peak(dtype, n, repeats, device):
        calls.append((dtype, n, torch.device(device).type))
        return 1e12 if dtype == torch.bfloat16 else 5e11

    monkeypatch.setattr(flops, "matmul_peak_flops", fake_peak)
    monkeypatch.setattr(flops, "fast_bf16_available", lambda device: True)
    cpu = torch.device("cpu")
    assert flops.training_peak_flops(cpu, "fp32") == flops.training_peak_flops(cpu, "fp32") == 5e11
    assert flops.training_peak_flops(cpu, "bf16") == 1e12
    assert calls == [(torch.float32, 2048, "cpu"), (torch.bfloat16, 2048, "cpu")]
    host.forget()  # a new process reads the measurement from disk
    assert flops.training_peak_flops(cpu, "bf16") == 1e12 and len(calls) == 2
    host.forget()


def test_the_peak_is_measured_where_training_reaches_it_and_small_where_bf16_is_emulated(monkeypatch):
    from nmt.model import flops

    cpu = torch.device("cpu")
    monkeypatch.setattr(flops, "fast_bf16_available", lambda device: False)
    assert flops.peak_size(cpu, "bf16") == 256 and flops.peak_size(cpu, "fp32") == 2048
    assert flops.peak_size(torch.device("cuda"), "bf16") == 8192
    monkeypatch.setattr(flops, "fast_bf16_available", lambda device: True)
    assert flops.peak_size(cpu, "bf16") == 2048


def test_mfu():
    assert mfu(2e12, 2.0, 4e12) == 0.25
    assert mfu(2e12, 2.0, 0.0) == 0.0  # no peak, no MFU

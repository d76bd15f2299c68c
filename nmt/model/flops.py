"""Analytic training FLOPs of the Transformer and measured matmul peak, for MFU.

MFU = (train_flops of the batches processed) / (elapsed seconds × matmul_peak_flops).
Training logs it (`nmt.train.progress`) against `training_peak_flops`, the peak in the run's precision
on its device, measured once per host; scripts/bench_train.py measures its own at the same size
(`peak_size`).
"""

from __future__ import annotations

import time

import torch

from nmt.config import ModelConfig
from nmt.hw.device import fast_bf16_available
from nmt.hw.host import probe

PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def forward_flops(
    cfg: ModelConfig, src_tokens: float, tgt_tokens: float, src_len: float, tgt_len: float, tgt_vocab: int
) -> float:
    """Matmul FLOPs of one forward pass (a multiply-add counts 2), see `train_flops`."""
    D, Fd = cfg.d_model, cfg.ffn_dim
    attn_proj = 8 * D * D  # Q, K, V and output projections: 4 matmuls of D×D
    ffn = 4 * D * Fd  # two matmuls D×F and F×D
    encoder = src_tokens * (attn_proj + ffn + 4 * src_len * D)
    decoder = tgt_tokens * (
        attn_proj
        + 4 * tgt_len * D  # causal self-attention, counted over the full T×T
        + 4 * D * D
        + 4 * src_len * D  # cross-attention: Q and output projections, scores, weighted sum
        + ffn
    )
    cross_kv = src_tokens * 4 * D * D  # cross-attention K, V projections of the memory, per decoder layer
    output = tgt_tokens * 2 * D * tgt_vocab
    return cfg.encoder_layers * encoder + cfg.decoder_layers * (decoder + cross_kv) + output


def train_flops(
    cfg: ModelConfig, src_tokens: float, tgt_tokens: float, src_len: float, tgt_len: float, tgt_vocab: int
) -> float:
    """Matmul FLOPs of one training step (forward + backward) on a batch.

    With D = d_model, F = ffn_dim, V = tgt_vocab, N_s / N_t the source / target token positions
    computed (padded counts for dense backends, real counts for flash), and S / T the key length
    each query attends to (the padded length, or sum(len^2) / sum(len) to count real work only):

        encoder layer   N_s (8D^2 + 4DF + 4SD)
        decoder layer   N_t (8D^2 + 4TD + 4D^2 + 4SD + 4DF) + N_s 4D^2
        output          N_t 2DV
        forward         E · encoder layer + L · decoder layer + output
        train           3 × forward

    8D^2: Q, K, V, output projections; 4SD: Q K^T and the weighted sum over S keys; 4DF: FFN;
    cross-attention projects Q and output per target token (4D^2) and K, V per source token.
    The backward pass costs two matmuls per forward matmul (input and weight gradients), hence 3×.
    Causal self-attention is counted over the full T×T score matrix, the convention of Chowdhery et
    al. (2022, PaLM, appendix B). Embedding lookups, softmax, LayerNorm and other element-wise work
    are not counted.
    """
    return 3.0 * forward_flops(cfg, src_tokens, tgt_tokens, src_len, tgt_len, tgt_vocab)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(
    dtype: torch.dtype, n: int = 2048, repeats: int = 20, device: torch.device | str | None = None
) -> float:
    """Measured FLOP/s of n×n @ n×n matmuls in `dtype` on `device` (default: CUDA if available,
    else CPU): best of three timed runs of `repeats` matmuls after a warm-up."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernel selection, clocks
    _sync(device)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b, out=out)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 * repeats / best


def peak_size(device: torch.device, precision: str) -> int:
    """n of the n×n matmuls whose rate MFU divides by, for training in a resolved `precision` on
    `device`: 8192 on CUDA (large enough to reach a big GPU's peak); 2048 on a CPU (where training's
    AMX and AVX-512 kernels reach theirs), 256 where bf16 is emulated (seconds a matmul otherwise).
    `training_peak_flops` and scripts/bench_train.py both measure at this size, so that train.log's
    MFU and the benchmark's mean the same thing."""
    if device.type == "cuda":
        return 8192
    return 256 if precision == "bf16" and not fast_bf16_available(device) else 2048


def training_peak_flops(device: torch.device, precision: str) -> float:
    """The matmul peak that training's MFU divides by: `matmul_peak_flops` in the dtype of
    `precision` (resolved: fp32, bf16 or fp16) on `device` at `peak_size`, measured once per host
    and thread count and cached (`nmt.hw.host.probe`; the name carries the GPU's)."""
    dtype, n = PEAK_DTYPES[precision], peak_size(device, precision)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = torch.cuda.get_device_name(index)
    else:
        where = "cpu"
    measure = lambda: matmul_peak_flops(dtype, n=n, repeats=5, device=device)  # noqa: E731
    return float(probe(f"matmul-peak {precision} {where} {n}", measure))


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: `flops` done in `seconds` over the `peak` rate (0 without a peak)."""
    return flops / seconds / peak if peak > 0 and seconds > 0 else 0.0

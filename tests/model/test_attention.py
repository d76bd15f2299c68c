"""MultiHeadAttention: backend parity, fully masked rows, the flash packing logic (with and without the
batch's host-computed packing), backend choice."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt import PAD_ID
from nmt.batches.batching import collate
from nmt.config import ModelConfig, TrainConfig
from nmt.errors import ConfigError
from nmt.model import attention
from nmt.model.attention import MultiHeadAttention, dense_mask, flash_attention, math_attention, resolve_backend
from nmt.model.masks import causal_mask, lengths_to_padding_mask, packing_from_lengths
from nmt.model.transformer import Transformer
from nmt.train.update import Trainer

D, H = 32, 4


def random_pad(B: int, L: int, min_len: int = 1) -> torch.Tensor:
    """(B, L) right padding with random lengths in [min_len, L]; at least one row is full."""
    lengths = torch.randint(min_len, L + 1, (B,))
    lengths[0] = L
    return lengths_to_padding_mask(lengths, L)


def run(mha: MultiHeadAttention, backend: str, x, memory, key_pad, query_pad, causal, **packing):
    """Output and gradients (input, memory, parameters) of a loss over real query positions.
    `packing`: key_packing / query_packing for the module."""
    mha.backend = backend
    mha.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    memory = None if memory is None else memory.detach().clone().requires_grad_(True)
    out = mha(x, memory, key_pad=key_pad, query_pad=query_pad, causal=causal, **packing)  # (B, T, D)
    real = ~query_pad if query_pad is not None else torch.ones(out.shape[:2], dtype=torch.bool, device=out.device)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    (out * weights * real[..., None]).sum().backward()
    grads = [x.grad] + ([] if memory is None else [memory.grad]) + [p.grad for p in mha.parameters()]
    return out, real, grads


CASES = {
    "encoder_self": dict(memory=False, causal=False),
    "decoder_self": dict(memory=False, causal=True),
    "cross": dict(memory=True, causal=False),
}


@pytest.mark.invariance
@pytest.mark.parametrize("case", list(CASES))
def test_math_and_sdpa_agree_on_outputs_and_gradients(case):
    spec = CASES[case]
    B, T, S = 5, 9, 7
    mha = MultiHeadAttention(D, H, dropout=0.0)
    x = torch.randn(B, T, D)
    memory = torch.randn(B, S, D) if spec["memory"] else None
    query_pad = random_pad(B, T)
    key_pad = random_pad(B, S) if spec["memory"] else query_pad
    results = {b: run(mha, b, x, memory, key_pad, query_pad, spec["causal"]) for b in ("math", "sdpa")}
    (out_m, real, grads_m), (out_s, _, grads_s) = results["math"], results["sdpa"]
    assert query_pad.any(), "the example must contain padding"
    torch.testing.assert_close(out_m[real], out_s[real], atol=1e-5, rtol=1e-5)
    for gm, gs in zip(grads_m, grads_s, strict=True):
        torch.testing.assert_close(gm, gs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_fully_masked_rows_give_zeros_and_finite_gradients(backend, causal):
    B, T = 3, 5
    mha = MultiHeadAttention(D, H, backend=backend)
    key_pad = torch.zeros(B, T, dtype=torch.bool)
    key_pad[1] = True  # a row that is padding only
    key_pad[2, 3:] = True
    x = torch.randn(B, T, D, requires_grad=True)
    out = mha(x, key_pad=key_pad, causal=causal)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters())
    if not causal or backend == "math":  # sdpa's causal path never masks keys, see the module doc
        expected = mha.out_proj.bias.expand(T, D)  # zero attention output → bias only
        torch.testing.assert_close(out[1], expected)


def test_math_attention_zero_for_all_masked_query():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False]])[None, None]  # (1, 1, 2, 3)
    out = math_attention(q, k, v, mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    probs = (q[0, 0, 0] @ k[0, 0, :2].T / 2.0).softmax(-1)  # d_k = 4 → scale 1/2
    torch.testing.assert_close(out[0, 0, 0], probs @ v[0, 0, :2])


def test_cross_attention_rejects_causal():
    mha = MultiHeadAttention(D, H)
    with pytest.raises(ValueError):
        mha(torch.randn(1, 2, D), torch.randn(1, 3, D), causal=True)


# --------------------------------------------------------------------------- flash packing on CPU


def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)):
    """A CPU stand-in for varlen_attn with the real one's input contract, one sequence at a time."""
    assert q.dim() == 3 and k.shape == v.shape and q.shape[1:] == k.shape[1:]
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32 and len(cu_q) == len(cu_k)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert isinstance(max_q, int) and isinstance(max_k, int)
    assert int(cu_q[-1]) == q.size(0) and int(cu_k[-1]) == k.size(0)
    assert max_q == int((cu_q[1:] - cu_q[:-1]).max()) and max_k == int((cu_k[1:] - cu_k[:-1]).max())
    assert tuple(window_size) in ((-1, -1), (-1, 0))
    out = torch.zeros_like(q)
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if qe == qs or ke == ks:
            continue
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[qs:qe], k[ks:ke], v[ks:ke]))  # (1, H, L, dk)
        o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=tuple(window_size) == (-1, 0))
        out[qs:qe] = o[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_flash_packing_matches_math_with_a_reference_kernel(case, monkeypatch):
    monkeypatch.setattr(attention, "_load_varlen", lambda: fake_varlen)  # window_size signature
    spec = CASES[case]
    B, T, S, dk = 4, 6, 8, D // H
    q = torch.randn(B, T, H, dk, requires_grad=True)
    S = T if not spec["memory"] else S
    k, v = torch.randn(B, S, H, dk, requires_grad=True), torch.randn(B, S, H, dk, requires_grad=True)
    query_pad = random_pad(B, T)
    key_pad = random_pad(B, S) if spec["memory"] else query_pad
    out = flash_attention(q, k, v, query_pad, key_pad, spec["causal"])  # (B, T, H, dk)
    mask = dense_mask(key_pad, spec["causal"], T, q.device)
    ref = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask).transpose(1, 2)
    real = ~query_pad
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(out[query_pad], torch.zeros_like(out[query_pad]))  # re-padded with zeros
    out.sum().backward()
    assert torch.equal(q.grad[query_pad], torch.zeros_like(q.grad[query_pad]))


# --------------------------------------------------------------------------- host packing (no device sync)


def random_lengths(B: int, L: int, gen: torch.Generator, empty_row: bool = False) -> list[int]:
    """B lengths in [1, L] (row 0 full), or in [0, L] with row B-1 empty when `empty_row`."""
    lengths = torch.randint(1, L + 1, (B,), generator=gen).tolist()
    lengths[0] = L
    if empty_row:
        lengths[-1] = 0
    return lengths


@pytest.mark.parametrize("seed", range(4))
def test_packing_from_lengths_is_unpad_index_of_the_padding_mask(seed):
    gen = torch.Generator().manual_seed(seed)
    B, L = 1 + seed * 3, 2 + seed * 4  # seed 0: a batch of one
    cases = [(random_lengths(B, L, gen, empty_row=seed > 0), L), ([0], 3), ([0, 0], 2), ([5], 5)]
    for lengths, width in cases:
        packing = packing_from_lengths(lengths, width)
        index, cu, max_len = attention._unpad_index(lengths_to_padding_mask(torch.tensor(lengths), width))
        assert torch.equal(packing.index, index) and packing.index.dtype == torch.int64, lengths
        assert torch.equal(packing.cu_seqlens, cu) and packing.cu_seqlens.dtype == torch.int32, lengths
        assert packing.max_len == max_len and type(packing.max_len) is int, lengths
        assert packing.width == width
    with pytest.raises(ValueError, match="width"):
        packing_from_lengths([3, 5], 4)


def packed_math(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """A CPU stand-in for `varlen_kernel()`: q (Nq, H, dk), k/v (Nk, H, dk) packed, sequence b in
    rows cu[b]:cu[b+1] → (Nq, H, dk), `math_attention` one sequence at a time. Checks the real
    kernel's contract: int32 cu_seqlens, exact maximum lengths given as host ints. Queries of a
    sequence without keys get ones (what a kernel leaves there is not defined; the caller zeroes it)."""
    assert cu_q.dtype == cu_k.dtype == torch.int32 and len(cu_q) == len(cu_k)
    assert type(max_q) is int and type(max_k) is int
    q_lengths, k_lengths = cu_q.diff().tolist(), cu_k.diff().tolist()
    assert max_q == max(q_lengths) and max_k == max(k_lengths)
    assert int(cu_q[-1]) == q.size(0) and int(cu_k[-1]) == k.size(0)
    out = torch.zeros_like(q)
    for qs, qe, ks, ke in zip(
        cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist(), strict=True
    ):
        if ke == ks:
            out[qs:qe] = 1.0
            continue
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[qs:qe], k[ks:ke], v[ks:ke]))  # (1, H, L, dk)
        mask = causal_mask(qe - qs)[None, None] if causal else None  # self-attention: qe - qs == ke - ks
        out[qs:qe] = math_attention(qi, ki, vi, mask)[0].transpose(0, 1)
    return out


def count_unpads(monkeypatch) -> list[int]:
    """`_unpad_index` still works but counts its calls (each one is two host syncs on a GPU)."""
    calls, unpad = [], attention._unpad_index
    monkeypatch.setattr(attention, "_unpad_index", lambda pad: calls.append(1) or unpad(pad))
    return calls


@pytest.mark.parametrize("case", list(CASES))
def test_flash_with_host_packing_computes_what_it_computes_without(case, monkeypatch):
    monkeypatch.setattr(attention, "varlen_kernel", lambda: packed_math)
    unpads = count_unpads(monkeypatch)
    spec, gen = CASES[case], torch.Generator().manual_seed(5)
    B, T, dk = 5, 7, D // H
    S = 9 if spec["memory"] else T
    q_lengths = random_lengths(B, T, gen)
    k_lengths = random_lengths(B, S, gen, empty_row=True) if spec["memory"] else q_lengths
    query_pad = lengths_to_padding_mask(torch.tensor(q_lengths), T)
    key_pad = lengths_to_padding_mask(torch.tensor(k_lengths), S) if spec["memory"] else query_pad
    q = torch.randn(B, T, H, dk, generator=gen)
    k, v = torch.randn(B, S, H, dk, generator=gen), torch.randn(B, S, H, dk, generator=gen)
    weights = torch.randn(B, T, H, dk, generator=gen)

    def attend(q_packing, k_packing):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = flash_attention(*leaves, query_pad, key_pad, spec["causal"], q_packing, k_packing)
        (out * weights).sum().backward()
        return out.detach(), [t.grad for t in leaves]

    out, grads = attend(packing_from_lengths(q_lengths, T), packing_from_lengths(k_lengths, S))
    assert unpads == []  # with the host packing nothing is read back from the device
    out_dev, grads_dev = attend(None, None)
    assert len(unpads) == (2 if spec["memory"] else 1)  # without it: unpadded from the masks
    assert torch.equal(out, out_dev)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_dev, strict=True))
    mask = dense_mask(key_pad, spec["causal"], T, q.device)
    ref = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask).transpose(1, 2)
    real = ~query_pad
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(out[query_pad], torch.zeros_like(out[query_pad]))


def test_flash_refuses_a_packing_of_another_shape(monkeypatch):
    monkeypatch.setattr(attention, "varlen_kernel", lambda: packed_math)
    q = torch.randn(2, 4, H, D // H)
    with pytest.raises(ValueError, match="packing"):
        flash_attention(q, q, q, None, None, False, packing_from_lengths([4, 2], 5), None)  # width 5, not 4
    with pytest.raises(ValueError, match="packing"):
        flash_attention(q, q, q, None, None, False, packing_from_lengths([4], 4), None)  # 1 row, not 2


def flash_model_on_cpu(monkeypatch) -> Transformer:
    """A small Transformer whose attention runs the flash path on the CPU: `resolve_backend` (which
    refuses flash without CUDA) patched to run what is asked for, the varlen kernel replaced by
    `packed_math`, and `_unpad_index` (the device-sync path) raising."""
    cfg = ModelConfig(d_model=D, heads=H, encoder_layers=2, decoder_layers=2, ffn_dim=64, dropout=0.0)
    cfg.attention = "flash"
    torch.manual_seed(0)
    model = Transformer(cfg, 50, 60)
    monkeypatch.setattr(attention, "resolve_backend", lambda requested, device, dtype, **_: requested)
    monkeypatch.setattr(attention, "varlen_kernel", lambda: packed_math)

    def no_sync(pad):
        raise AssertionError("_unpad_index called: an attention call read the padding back from the device")

    monkeypatch.setattr(attention, "_unpad_index", no_sync)
    return model


def random_pairs(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(4, 50, rng.integers(1, 12)).tolist(), rng.integers(4, 60, rng.integers(1, 12)).tolist())
             for _ in range(n - 1)]  # fmt: skip
    return pairs + [([], [])]  # an empty sentence: source EOS only, target BOS only


def set_backend(model: Transformer, backend: str) -> None:
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.backend = backend


def test_model_forward_with_the_batch_packing_never_unpads_on_the_device(monkeypatch):
    model = flash_model_on_cpu(monkeypatch).eval()
    batch = collate(random_pairs(6, seed=1))
    keep = batch.tgt_out != PAD_ID  # (B, T)
    with torch.no_grad():
        flash = model(batch.src, batch.tgt_in, keep, packing=batch.packing)  # (N, V)
        set_backend(model, "math")
        reference = model(batch.src, batch.tgt_in, keep)
        gathered = model(batch.src, batch.tgt_in, keep, packing=batch.packing)  # kept rows by packing.index
        torch.testing.assert_close(gathered, reference, atol=0, rtol=0)
        set_backend(model, "flash")
        with pytest.raises(AssertionError, match="_unpad_index"):  # without the packing: the sync path
            model(batch.src, batch.tgt_in, keep)
    assert flash.shape == (int(keep.sum()), 60)
    torch.testing.assert_close(flash, reference, atol=1e-5, rtol=1e-5)


def test_a_training_update_hands_the_batch_packing_to_the_model(monkeypatch):
    """Trainer.update moves a collated Batch, packing included, and passes it on: a whole
    forward + backward + step with flash and not one `_unpad_index` (tests/train is another owner's)."""
    model = flash_model_on_cpu(monkeypatch).train()
    trainer = Trainer(model, TrainConfig(precision="fp32", warmup=1), torch.device("cpu"), precision="fp32")
    before = [p.detach().clone() for p in model.parameters()]
    trainer.update([collate(random_pairs(4, seed=2)), collate(random_pairs(3, seed=3))])
    [result] = trainer.sync()
    assert not result.skipped and math.isfinite(result.loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# --------------------------------------------------------------------------- backend choice


def test_resolve_backend(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    measured = {torch.float32: "sdpa", torch.bfloat16: "math"}
    monkeypatch.setattr(attention, "_cpu_choice", lambda dtype, head_dim, grad: measured[dtype])
    assert resolve_backend("auto", cpu, torch.float32) == "sdpa"  # on a CPU: what the probe measured
    assert resolve_backend("auto", cpu, torch.bfloat16) == "math"
    assert resolve_backend("auto", cuda, torch.bfloat16) == "sdpa"  # measured faster than flash on an H200
    assert resolve_backend("auto", cuda, torch.float16) == "sdpa"
    assert resolve_backend("auto", cuda, torch.float32) == "sdpa"
    assert resolve_backend("auto", cuda, torch.bfloat16, dropout=0.1) == "sdpa"
    assert resolve_backend("flash", cuda, torch.bfloat16) == "flash"
    assert resolve_backend("flash", cuda, torch.float32) == "sdpa"
    assert resolve_backend("flash", cuda, torch.bfloat16, head_dim=12) == "sdpa"
    assert resolve_backend("flash", cuda, torch.bfloat16, head_dim=512) == "sdpa"
    assert resolve_backend("math", cuda, torch.bfloat16) == "math"
    assert resolve_backend("sdpa", cpu, torch.float32) == "sdpa"
    with pytest.raises(ConfigError, match="model.attention"):
        resolve_backend("flash", cpu, torch.bfloat16)
    with pytest.raises(ConfigError, match="model.attention"):
        resolve_backend("fast", cpu, torch.float32)


def test_flash_module_on_cpu_raises_config_error():
    mha = MultiHeadAttention(D, H, backend="flash")  # building is device-free; running on CPU is not
    with pytest.raises(ConfigError, match="model.attention"):
        mha(torch.randn(1, 3, D))


# --------------------------------------------------------------------------- CUDA only


def host_packing(pad: torch.Tensor, device: str):
    """The `Packing` of a CPU (B, L) right-padding mask, built on the host, moved to `device`."""
    return packing_from_lengths((~pad).sum(dim=1).tolist(), pad.size(1)).to(device)


@pytest.mark.cuda
@pytest.mark.parametrize("packed", [False, True], ids=["unpad-on-device", "host-packing"])
@pytest.mark.parametrize("case", list(CASES))
def test_flash_matches_math_on_cuda(case, packed):
    spec = CASES[case]
    B, T, S = 6, 40, 33
    mha = MultiHeadAttention(64, 4).cuda()
    x = torch.randn(B, T, 64, device="cuda")
    memory = torch.randn(B, S, 64, device="cuda") if spec["memory"] else None
    query_pad = random_pad(B, T)
    key_pad = random_pad(B, S) if spec["memory"] else query_pad
    packing = {"query_packing": host_packing(query_pad, "cuda"), "key_packing": host_packing(key_pad, "cuda")}
    query_pad = query_pad.cuda()
    key_pad = key_pad.cuda() if spec["memory"] else query_pad
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_f, real, grads_f = run(
            mha, "flash", x, memory, key_pad, query_pad, spec["causal"], **(packing if packed else {})
        )
        out_b, _, grads_b = run(mha, "math", x, memory, key_pad, query_pad, spec["causal"])  # math in bf16
    out_m, _, grads_m = run(mha, "math", x, memory, key_pad, query_pad, spec["causal"])  # fp32 reference

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b).abs().max())

    # flash in bf16 is as close to the fp32 reference as math in bf16 is (scripts/gpu_check.py's rule)
    assert err(out_f[real], out_m[real]) <= 3 * err(out_b[real], out_m[real]) + 1e-3
    for gf, gb, gm in zip(grads_f[:2], grads_b[:2], grads_m[:2], strict=True):
        assert err(gf, gm) <= 3 * err(gb, gm) + 1e-3


def test_cpu_auto_backend_is_the_faster_one_measured():
    assert attention.faster_dense_backend(torch.float32, 16, grad=True, shape=(2, 2, 8)) in ("math", "sdpa")
    assert attention.faster_dense_backend(torch.bfloat16, 16, grad=False, shape=(2, 2, 8)) in ("math", "sdpa")


def test_varlen_signature_is_adapted_or_refused(monkeypatch):
    """torch 2.13 takes window_size, 2.9-2.10 is_causal; anything else runs sdpa instead of flash."""
    calls = []

    def new_style(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)):
        calls.append(window_size)

    def old_style(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        calls.append(is_causal)

    for fn, expected in ((new_style, [(-1, 0), (-1, -1)]), (old_style, [True, False])):
        calls.clear()
        monkeypatch.setattr(attention, "_load_varlen", lambda fn=fn: fn)
        kernel = attention.varlen_kernel()
        kernel(*[None] * 7, True)
        kernel(*[None] * 7, False)
        assert calls == expected
    monkeypatch.setattr(attention, "_load_varlen", lambda: lambda q, k, v, cu_q, cu_k, max_q, max_k, mode: None)
    assert attention.varlen_kernel() is None
    assert resolve_backend("flash", torch.device("cuda"), torch.bfloat16) == "sdpa"
    monkeypatch.setattr(attention, "_load_varlen", lambda: None)  # torch < 2.9
    assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == "sdpa"


def test_installed_torch_varlen_signature_is_known():
    pytest.importorskip("torch.nn.attention.varlen")
    assert attention.varlen_kernel() is not None


@pytest.mark.invariance
@pytest.mark.parametrize("sentences", [3, 16])  # 12 and 64 (sentence × head) blocks: both kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("keys", [1, 5, 16, 40])
def test_step_attention_equals_math_attention_with_padding_bias(keys, dtype, sentences):
    from nmt.model.masks import cross_attention_bias

    torch.manual_seed(keys)
    N = sentences
    q = torch.randn(N, 4, 2, 8, dtype=dtype)  # (N, H, beam, dk)
    k, v = torch.randn(N, 4, keys, 8, dtype=dtype), torch.randn(N, 4, keys, 8, dtype=dtype)
    pad = torch.zeros(N, keys, dtype=torch.bool)
    pad[0, keys // 2 + 1 :] = True  # a padded source
    pad[2] = True  # no real key at all: finite bias, no NaN (the decoder zeroes such rows)
    got = attention.step_attention(q, k, v, cross_attention_bias(pad, dtype))  # (N, 4, 2, 8)
    want = attention.math_attention(q, k, v, ~pad[:, None, None, :])
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    real = torch.ones(N, dtype=torch.bool)
    real[2] = False
    torch.testing.assert_close(got[real], want[real], **tol)
    assert not got.isnan().any()
    torch.testing.assert_close(attention.step_attention(q, k, v), attention.math_attention(q, k, v, None), **tol)


def test_step_attention_writes_the_math_out_for_many_blocks_of_beams(monkeypatch):
    """The fused kernel for one sentence's beams or any single query per block; the written-out
    math from QUERY_BLOCKS_FOR_MATH blocks of several queries (beams) on."""
    fused, kernel = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        fused.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    blocks = attention.QUERY_BLOCKS_FOR_MATH
    k = v = torch.randn(blocks, 1, 6, 8)
    for beams, n in ((5, blocks), (5, blocks - 1), (1, blocks)):
        attention.step_attention(torch.randn(n, 1, beams, 8), k[:n], v[:n])
    assert fused == [torch.Size([blocks - 1, 1, 5, 8]), torch.Size([blocks, 1, 1, 8])]


def test_the_step_attention_benchmark_prints_both_kernels_and_the_choice(monkeypatch, capsys):
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_step_attention.py"
    spec = importlib.util.spec_from_file_location("bench_step_attention", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "CROSS", [(1, 5, 3), (16, 5, 3)])
    monkeypatch.setattr(bench, "SELF", [(2, 3)])
    monkeypatch.setattr(sys, "argv", ["bench", "--repeats", "1", "--threads", "1", "--head-dim", "8"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines if line.startswith(("| cross", "| self"))]
    assert [(r[1], r[2], r[-1]) for r in rows] == [
        ("1 sentences × beam 5, 3 keys", "4", "fused |"),
        ("16 sentences × beam 5, 3 keys", "64", "math |"),
        ("2 rows, 3 cached", "8", "fused |"),
    ]
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows)


def test_the_written_out_step_is_a_cpu_rule_only():
    """On CUDA (here: any non-CPU device, shapes only) the fused kernel serves every shape."""
    beams = (attention.QUERY_BLOCKS_FOR_MATH, 1, 5, 8)
    assert attention.step_kernel(torch.empty(beams)) == "math"
    assert attention.step_kernel(torch.empty(beams, device="meta")) == "fused"


def test_head_scores_are_the_heads_attention_before_its_softmax(monkeypatch):
    """`head_scores` of head h, softmaxed over the real keys, is head h of the module's own
    attention: the weighted sum of its values gives that head's slice of the output."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, backend="math").eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    pad = random_pad(2, 7)
    captured = {}
    original = attention.math_attention

    def spy(q, k, v, mask, p=0.0):
        captured["v"] = v  # (B, H, S, dk)
        out = original(q, k, v, mask, p)
        captured["out"] = out  # (B, H, T, dk)
        return out

    monkeypatch.setattr(attention, "math_attention", spy)
    mha(x, memory, key_pad=pad)
    for head in range(H):
        probs = mha.head_scores(x, memory, head).masked_fill(pad[:, None, :], float("-inf")).softmax(-1)  # (B, T, S)
        torch.testing.assert_close(probs @ captured["v"][:, head], captured["out"][:, head], rtol=1e-5, atol=1e-6)


def test_head_scores_are_fp32_under_autocast():
    """Under a bf16 autocast the scores stay an fp32 matmul (a loss on them needs small probabilities)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, backend="math")
    x, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    plain = mha.head_scores(x, memory, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = mha.head_scores(x, memory, 1)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, plain, rtol=0.05, atol=0.05)  # q and k were bf16 linears

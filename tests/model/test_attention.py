"""MultiHeadAttention: backend parity, fully masked rows, the flash packing logic, backend choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ConfigError
from nmt.model import attention
from nmt.model.attention import MultiHeadAttention, dense_mask, flash_attention, math_attention, resolve_backend
from nmt.model.masks import lengths_to_padding_mask

D, H = 32, 4


def random_pad(B: int, L: int, min_len: int = 1) -> torch.Tensor:
    """(B, L) right padding with random lengths in [min_len, L]; at least one row is full."""
    lengths = torch.randint(min_len, L + 1, (B,))
    lengths[0] = L
    return lengths_to_padding_mask(lengths, L)


def run(mha: MultiHeadAttention, backend: str, x, memory, key_pad, query_pad, causal):
    """Output and gradients (input, memory, parameters) of a loss over real query positions."""
    mha.backend = backend
    mha.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    memory = None if memory is None else memory.detach().clone().requires_grad_(True)
    out = mha(x, memory, key_pad=key_pad, query_pad=query_pad, causal=causal)  # (B, T, D)
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


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_flash_matches_math_on_cuda(case):
    spec = CASES[case]
    B, T, S = 6, 40, 33
    mha = MultiHeadAttention(64, 4).cuda()
    x = torch.randn(B, T, 64, device="cuda")
    memory = torch.randn(B, S, 64, device="cuda") if spec["memory"] else None
    query_pad = random_pad(B, T).cuda()
    key_pad = random_pad(B, S).cuda() if spec["memory"] else query_pad
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_f, real, grads_f = run(mha, "flash", x, memory, key_pad, query_pad, spec["causal"])
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


@pytest.mark.parametrize("keys", [1, 5, 15, 16, 40])
def test_softmax_last_equals_torch_softmax_for_short_and_long_rows(keys):
    x = torch.randn(6, 4, 2, keys) * 4
    x[0, :, :, keys // 2 :] = torch.finfo(torch.float32).min  # padded keys, as the decoding bias makes them
    x[1] = torch.finfo(torch.float32).min  # every key padded: uniform, as torch gives it
    got = attention.softmax_last(x)
    torch.testing.assert_close(got, x.softmax(dim=-1), rtol=1e-6, atol=1e-7)
    assert got.shape == x.shape and torch.allclose(got.sum(dim=-1), torch.ones(6, 4, 2))

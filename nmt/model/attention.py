"""One multi-head attention module with interchangeable backends.

Backends (chosen per call by `resolve_backend`, from the configured name, the device and the
dtype the projections produced, so that autocast is taken into account):

- ``math``:  the readable reference, softmax(Q K^T / sqrt(d_k)) V with boolean masks and an fp32
  softmax. A query whose keys are all masked gets a zero output, never NaN.
- ``sdpa``:  `torch.nn.functional.scaled_dot_product_attention` with the same boolean masks.
  Causal self-attention over right-padded sequences passes ``is_causal=True`` and no mask: a real
  query only sees earlier positions, which are all real, so the key padding only changes the
  (ignored) outputs at padded query positions.
- ``flash`` (CUDA, fp16/bf16): unpad to packed (total_tokens, heads, d_k) tensors, run
  `torch.nn.attention.varlen.varlen_attn` with int32 cu_seqlens, re-pad with zeros. Where the real
  tokens are comes from the batch's `Packing` (computed on the host by the batch builder, passed as
  ``query_packing``/``key_packing``); without one it is read from the padding mask on the device,
  which waits for the GPU twice per call.

Outputs at padded *query* positions are unspecified (they differ between backends) and must be
ignored by the caller; outputs at real positions agree between backends.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.errors import ConfigError
from nmt.hw.host import best_time, probe
from nmt.model.dropout import dropout
from nmt.model.kv_cache import DecoderState, KVCache
from nmt.model.masks import Packing, attention_mask_from_padding, causal_mask, decoder_self_mask
from nmt.model.row_buckets import bucketed

BACKENDS = ("auto", "math", "sdpa", "flash")
_HALF = (torch.float16, torch.bfloat16)


def resolve_backend(
    requested: str, device: torch.device, dtype: torch.dtype, *, dropout: float = 0.0, head_dim: int = 64
) -> str:
    """The backend that runs for tensors on `device` in `dtype`: "math", "sdpa" or "flash".

    auto → sdpa on CUDA (PyTorch's fused kernels); on a CPU whichever of math and sdpa a timed
    probe found faster for this dtype and head size (forward + backward when gradients are on:
    in bf16 training math wins clearly, in fp32 sdpa). "flash" is asked for by name: on an H200
    it measured slower than sdpa in training when its unpadding waited for the GPU twice per call
    (docs/BENCHMARKS.md, "GPU"; batches now carry that metadata from the host, not yet measured
    on a GPU). An explicit "flash"
    on a non-CUDA device raises ConfigError (at use: a flash-trained model still loads anywhere).
    Where the varlen kernel cannot run on CUDA, "flash" runs sdpa: fp32 (e.g. evaluation without
    autocast), attention dropout in training (`dropout` > 0; the kernel has none), a head
    dimension that is not a multiple of 8 or exceeds 256, a torch without a `varlen_attn` whose
    signature nmt knows (`varlen_kernel`).
    """
    if requested not in BACKENDS:
        raise ConfigError(f"model.attention: unknown backend {requested!r} (use one of {' | '.join(BACKENDS)})")
    device_type = torch.device(device).type
    if requested == "flash" and device_type != "cuda":
        raise ConfigError(
            f"model.attention: 'flash' needs a CUDA device, but the model runs on {device} (use auto or sdpa)"
        )
    if requested in ("math", "sdpa"):
        return requested
    if requested == "auto":
        return _cpu_choice(dtype, head_dim, torch.is_grad_enabled()) if device_type == "cpu" else "sdpa"
    flash_ok = dtype in _HALF and dropout == 0.0 and head_dim % 8 == 0 and head_dim <= 256
    if device_type == "cuda" and flash_ok and varlen_kernel() is not None:
        return "flash"
    return "sdpa"


@functools.cache
def _cpu_choice(dtype: torch.dtype, head_dim: int, grad: bool) -> str:
    name = f"cpu-attention {str(dtype).removeprefix('torch.')} dk{head_dim} {'train' if grad else 'infer'}"
    return str(probe(name, lambda: faster_dense_backend(dtype, head_dim, grad)))


def faster_dense_backend(
    dtype: torch.dtype, head_dim: int, grad: bool, shape: tuple[int, int, int] = (16, 4, 32)
) -> str:
    """ "math" or "sdpa": the faster on this CPU for a batch `shape` = (B, H, T) of encoder
    self-attention with key padding, in `dtype`, forward (+ backward when `grad`)."""
    B, H, T = shape
    q, k, v = (torch.randn(B, H, T, head_dim, dtype=dtype, requires_grad=grad) for _ in range(3))
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[: B // 2, :, :, T - T // 4 :] = False  # some padding, as in a real batch

    def run(kernel: Callable[..., Tensor]) -> None:
        out = kernel(q, k, v, mask)
        if grad:
            out.float().sum().backward()

    times = {name: best_time(lambda f=f: run(f)) for name, f in (("math", math_attention), ("sdpa", sdpa_attention))}
    return min(times, key=lambda name: times[name])


# --------------------------------------------------------------------------- dense backends


def math_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """Reference attention. q (B, H, T, dk), k/v (B, H, S, dk), mask broadcastable to (B, H, T, S)
    with True = may attend → (B, H, T, dk). Softmax in fp32; fully masked rows give zeros."""
    scores = torch.matmul(q * (q.size(-1) ** -0.5), k.transpose(-2, -1)).float()  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)  # (B, H, T, S)
    if mask is not None:
        probs = probs * mask.any(dim=-1, keepdim=True)  # all-masked rows: uniform → zero
    probs = dropout(probs, dropout_p, training=dropout_p > 0)
    return torch.matmul(probs.to(v.dtype), v)  # (B, H, T, dk)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """`scaled_dot_product_attention` with a boolean mask (True = may attend); a query whose keys
    are all masked is unmasked for the kernel (which would give NaN) and its output zeroed."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    any_key = mask.any(dim=-1, keepdim=True)  # (B, 1, T|1, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~any_key, dropout_p=dropout_p)
    return out * any_key.to(out.dtype)  # (B, H, T, dk)


QUERY_BLOCKS_FOR_MATH = 32  # (batch × head) blocks of several queries each from which `step_attention`
# writes the math out on a CPU (docs/BENCHMARKS.md, "Interactive speed, fourth pass")


def step_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    """The kernel of incremental decoding: a few queries over cached keys, with an additive `bias`
    in q's dtype (broadcastable to (..., Tq, S); None: every key) instead of a boolean mask.
    q (..., Tq, dk), k/v (..., S, dk) → (..., Tq, dk); `math_attention`'s function up to rounding.

    Two kernels, chosen by shape alone (the reference step and `FastDecoder` always agree):
    one fused `scaled_dot_product_attention` call where a step is mostly per-operation overhead (a
    sentence decoded alone; one operation where the written-out math is five), and the written-out
    math for the cross-attention of beams on a CPU once there are `QUERY_BLOCKS_FOR_MATH` blocks
    of Tq > 1 queries: the fused CPU kernel tiles the queries of each block for long query runs,
    and with a few beams per block most of each tile is idle work."""
    if step_kernel(q) == "math":
        return step_attention_math(q, k, v, bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def step_kernel(q: Tensor) -> str:
    """Which kernel `step_attention` runs for the queries q (..., Tq, dk): "fused" or "math"."""
    blocks = q.numel() // (q.size(-1) * q.size(-2))  # batch × heads
    return "math" if q.size(-2) > 1 and blocks >= QUERY_BLOCKS_FOR_MATH and q.device.type == "cpu" else "fused"


def step_attention_math(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    """`step_attention` written out: scores and softmax in fp32, as the fused kernel keeps them."""
    scores = torch.matmul(q, k.transpose(-2, -1)).float().mul_(q.size(-1) ** -0.5)  # (..., Tq, S)
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)  # (..., Tq, dk)


def dense_mask(key_pad: Tensor | None, causal: bool, t_query: int, device: torch.device) -> Tensor | None:
    """The boolean attention mask (True = may attend) for the math and sdpa backends."""
    if causal:
        return causal_mask(t_query, device)[None, None] if key_pad is None else decoder_self_mask(key_pad)
    return None if key_pad is None else attention_mask_from_padding(key_pad)  # (B, 1, 1, S)


# --------------------------------------------------------------------------- flash (varlen) backend


def _load_varlen() -> Callable[..., Tensor] | None:
    """torch's `varlen_attn` (torch >= 2.9), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_kernel() -> Callable[..., Tensor] | None:
    """`varlen_attn` as f(q, k, v, cu_q, cu_k, max_q, max_k, causal), adapted to the installed
    torch: causality is `window_size=(-1, 0)` in torch >= 2.11 (checked against 2.13) and
    `is_causal=True` in torch 2.9-2.10. None without a known signature: flash then runs sdpa."""
    fn = _load_varlen()
    if fn is None:
        return None
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        return lambda q, k, v, cu_q, cu_k, max_q, max_k, causal: fn(
            q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0) if causal else (-1, -1)
        )
    if "is_causal" in params:
        return lambda q, k, v, cu_q, cu_k, max_q, max_k, causal: fn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=causal)
    return None


def _unpad_index(pad: Tensor) -> tuple[Tensor, Tensor, int]:
    """(B, L) padding mask → flat indices of real tokens (N,), cu_seqlens (B+1,) int32, max length."""
    real = ~pad
    lengths = real.sum(dim=1, dtype=torch.int32)  # (B,)
    index = real.flatten().nonzero().squeeze(1)  # (N,)
    cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # (B+1,)
    max_len = int(lengths.max()) if lengths.numel() else 0
    return index, cu, max_len


def _packing(pad: Tensor | None, given: Packing | None, rows: int, width: int, device: torch.device) -> Packing:
    """The `Packing` of a (rows, width) side: `given` (host metadata, checked against the shape
    without touching the device), else computed from `pad` (B, L) by `_unpad_index`, which waits for
    the device twice; None and None mean no padding."""
    if given is not None:
        if given.cu_seqlens.numel() != rows + 1 or given.width != width:
            got = f"{given.cu_seqlens.numel() - 1} rows of width {given.width}"
            raise ValueError(f"flash attention: packing for {got} given for a batch of {rows} rows of width {width}")
        return given
    if pad is None:
        pad = torch.zeros(rows, width, dtype=torch.bool, device=device)
    return Packing(*_unpad_index(pad), width=width)


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query_pad: Tensor | None,
    key_pad: Tensor | None,
    causal: bool,
    q_packing: Packing | None = None,
    k_packing: Packing | None = None,
) -> Tensor:
    """q (B, T, H, dk), k/v (B, S, H, dk) → (B, T, H, dk), zeros at padded query positions and for
    queries whose keys are all padding. Causal means query i sees keys j <= i (needs T == S).

    q_packing / k_packing: where the real queries / keys are, computed on the host by the batch
    builder (`nmt.batches.batching.collate`) and on q's device; with them no host sync happens here.
    A side without one is unpadded from its mask (`_unpad_index`: `nonzero` and a max read back).
    Causal self-attention uses the query packing for the keys unless `k_packing` is given."""
    B, T, H, dk = q.shape
    S = k.size(1)
    qp = _packing(query_pad, q_packing, B, T, q.device)
    if k_packing is None and (causal or (key_pad is not None and key_pad is query_pad)):
        k_packing = qp
    kp = _packing(key_pad, k_packing, B, S, k.device)
    q_packed = q.reshape(B * T, H, dk).index_select(0, qp.index).contiguous()  # (Nq, H, dk)
    k_packed = k.reshape(B * S, H, dk).index_select(0, kp.index).contiguous()  # (Nk, H, dk)
    v_packed = v.reshape(B * S, H, dk).index_select(0, kp.index).contiguous()  # (Nk, H, dk)
    kernel = varlen_kernel()
    if kernel is None:
        raise RuntimeError("flash attention needs torch.nn.attention.varlen.varlen_attn (torch >= 2.9)")
    packed = kernel(q_packed, k_packed, v_packed, qp.cu_seqlens, kp.cu_seqlens, qp.max_len, kp.max_len, causal)
    out = q.new_zeros(B * T, H, dk).index_copy(0, qp.index, packed.to(q.dtype))  # (B*T, H, dk)
    out = out.view(B, T, H, dk)
    has_keys = kp.cu_seqlens.diff() > 0  # (B,) rows with at least one real key, computed on the device
    return out * has_keys[:, None, None, None].to(out.dtype)


# --------------------------------------------------------------------------- the module


class MultiHeadAttention(nn.Module):
    """Multi-head attention with a fused [Q; K; V] input projection (one matmul for self-attention;
    cross-attention uses the Q rows on the queries and the K, V rows on the memory)."""

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, backend: str = "auto"):
        super().__init__()
        if d_model % heads:
            raise ConfigError(f"model.d_model: {d_model} is not divisible by model.heads={heads}")
        if backend not in BACKENDS:
            raise ConfigError(f"model.attention: unknown backend {backend!r}")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.dropout, self.backend = dropout, backend
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # rows: [W_q; W_k; W_v]
        self.out_proj = nn.Linear(d_model, d_model)
        self.q_proj: nn.Linear | None = None  # inference copies of the Q and K/V rows (split_projections)
        self.kv_proj: nn.Linear | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for chunk in self.in_proj.weight.data.chunk(3, dim=0):  # Xavier per D×D projection
            nn.init.xavier_uniform_(chunk)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def split_projections(self) -> None:
        """Inference only: `nn.Linear` modules holding copies of the Q rows and the K/V rows of the
        fused projection, used by cross-attention from then on (same outputs), so that module-level
        tools such as int8 quantisation see them. Later changes to `in_proj` are not followed."""
        D, w, b = self.d_model, self.in_proj.weight.detach(), self.in_proj.bias.detach()
        like = {"device": w.device, "dtype": w.dtype}
        self.q_proj, self.kv_proj = nn.Linear(D, D, **like), nn.Linear(D, 2 * D, **like)
        with torch.no_grad():
            self.q_proj.weight.copy_(w[:D])
            self.q_proj.bias.copy_(b[:D])
            self.kv_proj.weight.copy_(w[D:])
            self.kv_proj.bias.copy_(b[D:])

    def _project_q(self, x: Tensor) -> Tensor:
        D = self.d_model
        proj = self.q_proj or (lambda h: F.linear(h, self.in_proj.weight[:D], self.in_proj.bias[:D]))
        q = bucketed(proj, x)  # (B, T, D)
        return q.view(*x.shape[:2], self.heads, self.d_k)  # (B, T, H, dk)

    def _project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        D = self.d_model
        if self.kv_proj is not None:
            kv = self.kv_proj(memory)
        else:
            w, b = self.in_proj.weight[D:], self.in_proj.bias[D:]
            kv = bucketed(lambda m: F.linear(m, w, b), memory)  # (B, S, 2D)
        k, v = kv.view(*memory.shape[:2], 2, self.heads, self.d_k).unbind(2)
        return k, v  # (B, S, H, dk) each

    def head_scores(self, x: Tensor, memory: Tensor, head: int) -> Tensor:
        """One head's cross-attention scores, recomputed from the module's own weights: x (B, T, D)
        queries, memory (B, S, D) → (B, T, S) fp32 Q·Kᵀ/sqrt(d_k), unmasked. For losses on where
        the model looks (``train.guided_alignment``), which the fused backends never materialise;
        the same function of the weights as the head's attention, so its gradient trains them."""
        D, rows = self.d_model, slice(head * self.d_k, (head + 1) * self.d_k)
        w, b = self.in_proj.weight, self.in_proj.bias
        q = bucketed(lambda h: F.linear(h, w[rows], b[rows]), x)  # (B, T, dk)
        k = bucketed(lambda m: F.linear(m, w[D:][rows], b[D:][rows]), memory)  # (B, S, dk)
        # in fp32, autocast or not: a bf16 batched matmul costs oneDNN a new kernel for each new
        # (B, T, S), far more than this one head's few FLOPs (docs/benchmarks-log.md, "Names of
        # several words, ..."), and a loss on the attention needs its small probabilities
        with torch.autocast(q.device.type, enabled=False):
            return torch.matmul(q.float(), k.float().transpose(1, 2)) * self.d_k**-0.5  # (B, T, S)

    def _backend(self, device: torch.device, dtype: torch.dtype) -> str:
        dropout = self.dropout if self.training else 0.0
        return resolve_backend(self.backend, device, dtype, dropout=dropout, head_dim=self.d_k)

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, backend: str) -> Tensor:
        """q (B, H, T, dk), k/v (B, H, S, dk) → (B, H, T, dk)."""
        p = self.dropout if self.training else 0.0
        if backend == "math":
            return math_attention(q, k, v, mask, p)
        return sdpa_attention(q, k, v, mask, p)

    def _merge(self, out: Tensor) -> Tensor:
        """(B, T, H, dk) → output projection (B, T, D)."""
        return bucketed(self.out_proj, out.reshape(*out.shape[:2], self.d_model))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_pad: Tensor | None = None,
        query_pad: Tensor | None = None,
        causal: bool = False,
        *,
        key_packing: Packing | None = None,
        query_packing: Packing | None = None,
    ) -> Tensor:
        """Full-sequence attention. x (B, T, D) queries; memory (B, S, D) keys/values for
        cross-attention, or None for self-attention over x. key_pad (B, S|T) True = pad;
        query_pad (B, T) (defaults to key_pad for self-attention; only the flash backend needs
        it). causal: query i sees keys j <= i (self-attention only) → (B, T, D).
        key_packing / query_packing: the same padding as host-computed `Packing`s on x's device
        (query_packing defaults to key_packing for self-attention); only the flash backend reads
        them, and with them it never waits for the device."""
        if memory is None:
            B, T, _ = x.shape
            qkv = bucketed(self.in_proj, x).view(B, T, 3, self.heads, self.d_k)  # (B, T, 3, H, dk)
            q, k, v = qkv.unbind(2)  # (B, T, H, dk) each
            query_pad = key_pad if query_pad is None else query_pad
            query_packing = key_packing if query_packing is None else query_packing
        else:
            if causal:
                raise ValueError("causal attention is only defined for self-attention")
            q = self._project_q(x)
            k, v = self._project_kv(memory)
        backend = self._backend(x.device, q.dtype)
        if backend == "flash":
            out = flash_attention(q, k, v, query_pad, key_pad, causal, query_packing, key_packing)
            return self._merge(out)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, dk)
        if backend == "sdpa" and causal:
            p = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # see module doc
        else:
            out = self._dense(q, k, v, dense_mask(key_pad, causal, q.size(2), x.device), backend)
        return self._merge(out.transpose(1, 2))

    # ----------------------------------------------------------------------- incremental decoding

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output, computed once: (B, S, D) →
        two (B, H, S, dk) tensors for `cross_step`."""
        k, v = self._project_kv(memory)
        return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

    def self_step(self, x: Tensor, cache: KVCache, layer: int, t: int) -> Tensor:
        """One decoding step of self-attention. x (R, 1, D) → (R, 1, D); this token's K/V are written
        at position `t` of `cache` (layer `layer`). The token attends to every cached position and
        itself, so no mask is needed."""
        R = x.size(0)
        qkv = self.in_proj(x).view(R, 3, self.heads, self.d_k)  # (R, 3, H, dk)
        k, v = cache.append(layer, t, qkv[:, 1:])  # (R, H, t+1, dk) each
        out = step_attention(qkv[:, 0, :, None], k, v)  # (R, H, 1, dk)
        return self.out_proj(out.reshape(R, 1, self.d_model))

    def cross_step(self, x: Tensor, state: DecoderState, layer: int) -> Tensor:
        """One decoding step of cross-attention. x (R, 1, D) with R = N sentences × `state.beam`
        rows → (R, 1, D). The beams of a sentence are its queries: q (N, H, beam, dk) against the
        sentence's K/V (N, H, S, dk), computed once by `memory_kv`."""
        R, N = x.size(0), state.src_pad.size(0)
        q = self._project_q(x).view(N, R // N, self.heads, self.d_k).transpose(1, 2)  # (N, H, beam, dk)
        out = step_attention(q, state.cross_k[layer], state.cross_v[layer], state.cross_bias)  # (N, H, beam, dk)
        if state.cross_empty is not None:
            out = out * state.cross_empty.to(out.dtype)  # no real key: zero output, as in `forward`
        return self.out_proj(out.transpose(1, 2).reshape(R, 1, self.d_model))

"""Token rows rounded up to a bucket before a linear layer, so that matmul shapes repeat.

oneDNN, which runs PyTorch's bf16 matmuls on the CPU, makes (just-in-time compiles) a kernel for
each distinct matmul shape and keeps a bounded number of them (`nmt.hw.device.bound_kernel_cache`).
A training batch's token count, B × L, changes from batch to batch, so almost every update
pays for making its kernels again, in the forward and in both backward matmuls of every linear
layer. Inside `row_buckets(n)`, `bucketed(f, x)` pads the rows of x (the product of its leading
dimensions) with zeros up to a multiple of n, applies f and drops the extra rows: the matmuls see
a few shapes per layer, and autograd's backward matmuls see the same padded shapes. A row-wise f
(a linear layer) gives the real rows exactly what it gives them unpadded; the zero rows get no
gradient back, so the weights' gradients are unchanged too.

The trainer turns it on where the host needs it (`nmt.hw.device.matmul_row_bucket`); outside the
context (decoding, fp32 training, CUDA) `bucketed(f, x)` is `f(x)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch.nn.functional as F
from torch import Tensor

_BUCKET: ContextVar[int] = ContextVar("nmt_row_bucket", default=0)


@contextlib.contextmanager
def row_buckets(rows: int) -> Iterator[None]:
    """Inside, `bucketed` pads token rows to a multiple of `rows` (0 or 1: no padding)."""
    token = _BUCKET.set(rows)
    try:
        yield
    finally:
        _BUCKET.reset(token)


def padded_rows(rows: int, bucket: int) -> int:
    """`rows` rounded up to a multiple of `bucket` (unchanged for a bucket of 0 or 1)."""
    return rows if bucket <= 1 else -(-rows // bucket) * bucket


def bucketed(f: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """f(x) for a row-wise f, x (..., K) → (..., N), with x's rows padded to the active bucket
    for the call (see the module docstring)."""
    rows = x.numel() // x.size(-1)
    padded = padded_rows(rows, _BUCKET.get())
    if padded == rows:
        return f(x)
    flat = F.pad(x.reshape(rows, x.size(-1)), (0, 0, 0, padded - rows))  # (padded, K)
    out = f(flat)[:rows]  # (rows, N)
    return out.view(*x.shape[:-1], out.size(-1))

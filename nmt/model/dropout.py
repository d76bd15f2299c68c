"""Dropout whose masks are cheap on the CPU.

`torch.nn.functional.dropout` on a CPU tensor draws one Bernoulli variate per element from the
generator, one of the larger costs of a CPU update that is not a matmul (docs/BENCHMARKS.md,
"Where an update's time goes"). Here one 64-bit draw
from the same generator (`torch.randint`, so `torch.manual_seed` and the checkpointed RNG
state govern it as before) gives four 16-bit words, and an element is kept where its word
is at or above a threshold: each element is dropped with probability round(p · 2^16) / 2^16,
p to within 2^-17. The kept elements are scaled by 1 / (1 - p) as usual, and the backward
multiplies the gradient by the same mask and scale. Other devices (CUDA's fused kernel) and
p outside (0, 1) use `torch.nn.functional.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_WORD = 1 << 16  # a 16-bit word's values: the resolution of p


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A bool mask of `shape`, each element False (dropped) with probability round(p · 2^16) / 2^16,
    drawn from torch's default generator of `device`."""
    n = 1
    for size in shape:
        n *= size
    words = torch.randint(-(1 << 63), (1 << 63) - 1, (-(-n // 4),), dtype=torch.int64, device=device)
    threshold = round(p * _WORD) - _WORD // 2  # int16 words ≥ this are kept
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x · keep / (1 - p); the backward applies the same mask and scale to the gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep = keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x.mul(as_ones(keep, x.dtype)).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(as_ones(keep, grad.dtype)).mul_(ctx.scale), None


def as_ones(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool `mask` as 1.0 / 0.0 in `dtype`. Read as bytes first: ATen converts uint8 to a float
    type in vectorised code, bool element by element, and multiplying by a bool mask converts it
    the slow way inside the product (docs/benchmarks-log.md, "Cheaper dropout masks")."""
    return mask.view(torch.uint8).to(dtype)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Drop elements of `x` with probability `p` and scale the rest by 1 / (1 - p) in training;
    `x` itself otherwise (see the module docstring for the CPU path)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training=True)
    return _MaskedScale.apply(x, p)


class Dropout(nn.Module):
    """`dropout` as a module (in place of `torch.nn.Dropout`: the same `p`, the same training switch)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"

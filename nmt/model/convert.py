"""A trained model converted for decoding: weights cast once, linear layers packed or quantised.

`inference_model` is the one entry: ``bf16``/``fp16`` cast the weights once (autocast would re-cast
every weight at every decoding step); ``int8`` turns every linear layer into an `Int8Linear`, the
tied output projection included; on a CPU, fp32 and bf16 linear layers get their weights
pre-packed for oneDNN (`PackedLinear`). Each kernel is used only where `nmt.hw.host` found that it
runs on this machine; otherwise the layer stays a plain ``nn.Linear`` (packing), or int8 uses the
next kernel that runs. Which precision to decode in is `nmt.decode.precision.resolve_inference_precision`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.hw import host
from nmt.model.transformer import FeedForward

INT8_KERNELS = ("int8-fbgemm", "int8-qnnpack", "int8-onednn", "int8-weight")  # `nmt.hw.host` kernel names


def inference_model(
    model: torch.nn.Module, device: torch.device, precision: str, int8_kernel: str = ""
) -> torch.nn.Module:
    """`model` on `device` in eval mode, converted for decoding in the resolved `precision`
    (fp32 | bf16 | fp16 | int8). `int8_kernel`: one of `INT8_KERNELS` (default: the first that
    runs here; `nmt.decode.precision.fastest_int8_kernel` measures which is fastest)."""
    model = model.to(device).eval()
    if not isinstance(model, torch.nn.Module):  # a duck-typed decoding model (tests): used as it is
        return model
    if precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if precision == "bf16" else torch.float16)
    if precision == "int8":
        return quantize_int8(model, int8_kernel or int8_kernels()[0])
    if device.type == "cpu" and precision in ("fp32", "bf16"):
        return pack_linears(model, torch.bfloat16 if precision == "bf16" else torch.float32)
    return model


def int8_kernels() -> list[str]:
    """The int8 kernels that run on this host, in order of preference when nothing was measured;
    empty where none does (then int8 decoding is refused, `nmt.decode.precision`)."""
    here = host.current()
    return [k for k in INT8_KERNELS if here.has(k)]


# --------------------------------------------------------------------------- oneDNN packing


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` (CPU, fp32 or bf16) whose weight is laid out for oneDNN once, at load, instead
    of at every call: the same function up to summation order, faster for the few-row matmuls of
    decoding (most for the vocabulary projection). Needs the host's ``pack-fp32``/``pack-bf16``."""

    def __init__(self, linear: torch.nn.Linear, rows_hint: int = 64) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.op = torch.ops.mkldnn._linear_pointwise.default  # the overload: no Python dispatch checks
        self.post_op = "none"  # "relu": relu(linear(x)) in the kernel's epilogue (`fuse_relu`)
        self.weight_t = linear.weight.detach().t().contiguous()  # (K, N): the one-row path
        self.row_bias = torch.zeros(self.out_features, dtype=self.weight_t.dtype) if self.bias is None else self.bias

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() == self.in_features:  # one row: a matrix-vector product (see `one_row`)
            return self.one_row(x)
        return self.op(x, self.packed, self.bias, self.post_op, [], "")

    def one_row(self, x: Tensor) -> Tensor:
        """x (..., K) holding one row → (..., N). oneDNN's packed kernel is slow for a single row (a
        decoding step of one sentence, greedy): BLAS's matrix-vector product over the transposed
        weight streams the same bytes with far less per-call work (docs/BENCHMARKS.md)."""
        y = torch.addmm(self.row_bias, x.reshape(1, self.in_features), self.weight_t)  # (1, N)
        if self.post_op == "relu":
            y = y.relu_()
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)


def can_pack(dtype: torch.dtype) -> bool:
    """True when this host runs oneDNN's pre-packed linear layers in `dtype` (fp32 or bf16)."""
    return host.current().has("pack-bf16" if dtype == torch.bfloat16 else "pack-fp32")


def pack_linears(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Every `nn.Linear` of `model` (after `split_projections`, where the model has it) as a
    `PackedLinear`, in place; the model unchanged where this host cannot pack `dtype`."""
    if not can_pack(dtype):
        return model
    if hasattr(model, "split_projections"):
        model.split_projections()
    _replace_modules(model, torch.nn.Linear, PackedLinear)
    fuse_relu(model)
    return model


def fuse_relu(model: torch.nn.Module) -> None:
    """Every ReLU feed-forward block whose `fc1` is a `PackedLinear` applies the ReLU inside
    fc1's kernel (one pass over the (R, ffn_dim) activations fewer; the same outputs)."""
    for module in model.modules():
        if isinstance(module, FeedForward) and isinstance(module.fc1, PackedLinear) and module.act is F.relu:
            module.fc1.post_op, module.act = "relu", _unchanged


def _unchanged(x: Tensor) -> Tensor:
    return x


# --------------------------------------------------------------------------- int8


ROW_BUCKET = 16  # the oneDNN kernel pads its rows to a multiple of this


def quantize_int8(model: torch.nn.Module, kernel: str = "") -> torch.nn.Module:
    """Every `nn.Linear` as an `Int8Linear` on `kernel` (default: the first that runs here), in
    place. A model with `split_projections` (the Transformer) first exposes its weight slices and
    its tied output projection as linear layers, so that they are quantised too."""
    kernel = kernel or int8_kernels()[0]
    if hasattr(model, "split_projections"):
        model.split_projections()
    _replace_modules(model, torch.nn.Linear, lambda linear: Int8Linear(linear, kernel))
    return model


class Int8Linear(torch.nn.Module):
    """A linear layer in int8: weights quantised once with one scale per output feature, inputs at
    each call per row, so that every row's output is independent of the other rows (a sentence
    translates the same whichever sentences share its batch), multiplied exactly in int32.

    Two kernels, the same contract:

    - ``int8-fbgemm`` / ``int8-qnnpack``: PyTorch's dynamic quantised linear. It quantises its
      whole input with one range, so each row is first divided by its own largest magnitude and
      two columns holding +1 and -1 (whose weights are zero) are appended: every batch then has
      the range [-1, 1] exactly, each row's quantisation is its own, and the output is scaled
      back per row. fbgemm uses 7-bit activations (`reduce_range`), as PyTorch advises on x86,
      where 8 bits can saturate AVX2's 16-bit pair sums.
    - ``int8-onednn``: symmetric int8 rows and ``torch._int_mm``; fast where oneDNN has int8
      instructions (AVX-512 VNNI, AMX), a slow reference loop on AVX2.

    ``int8-weight`` keeps the int8 weights and their scales but not the activations' int8: each
    row is rounded to bf16 (8 significant bits instead of 7 bits of the row's range) and
    multiplied with ``torch.ops.aten._weight_int8pack_mm`` (fp32 accumulation, a bf16 result).
    One byte per weight streamed and one operation per call: the fastest where a step has a few
    rows (a sentence decoded alone), slower than fbgemm on large batches. The scales are rounded
    to bf16 before the weights are quantised, so the rounded scales are the exact ones.
    """

    def __init__(self, linear: torch.nn.Linear, kernel: str = "int8-onednn") -> None:
        super().__init__()
        if kernel not in INT8_KERNELS:
            raise ValueError(f"unknown int8 kernel {kernel!r} (one of {', '.join(INT8_KERNELS)})")
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        w = linear.weight.detach().float()  # (N, K)
        self.scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
        if kernel == "int8-weight":
            self.scale = self.scale.bfloat16().float()  # the kernel takes bf16 scales: quantise with those
        q = torch.round(w / self.scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (N, K)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        if kernel == "int8-weight":
            self.weight_q, self.scale_bf16 = q, self.scale.bfloat16()
            self.int8pack_mm = torch.ops.aten._weight_int8pack_mm.default  # the overload: no dispatch checks
        elif kernel == "int8-onednn":
            self.weight_t = q.t()  # (K, N)
        else:
            self.packed = _prepack(F.pad(q, (0, 2)), self.scale, kernel.removeprefix("int8-"))  # (N, K + 2)
            self.ends = torch.tensor([1.0, -1.0])

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "int8-weight":
            return self._weight_only(x)
        rows = x.reshape(-1, self.in_features).float()  # (M, K)
        y = self._int_mm(rows) if self.kernel == "int8-onednn" else self._dynamic(rows)  # (M, N)
        return y.view(*x.shape[:-1], self.out_features)

    def _weight_only(self, x: Tensor) -> Tensor:
        rows = (x if x.dim() == 2 else x.reshape(-1, self.in_features)).to(torch.bfloat16)  # (M, K)
        y = self.int8pack_mm(rows, self.weight_q, self.scale_bf16)  # (M, N) bf16
        y = y.float() if self.bias is None else torch.add(self.bias, y)  # fp32 (bf16 + fp32 promotes)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def _dynamic(self, rows: Tensor) -> Tensor:
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)  # (M, 1)
        unit = torch.cat([rows / row_scale, self.ends.expand(rows.size(0), 2)], dim=1)  # (M, K + 2) in [-1, 1]
        y = torch.ops.quantized.linear_dynamic(unit, self.packed, self.kernel == "int8-fbgemm")  # (M, N)
        return y.mul_(row_scale) if self.bias is None else torch.addcmul(self.bias, y, row_scale, out=y)

    def _int_mm(self, rows: Tensor) -> Tensor:
        M = rows.size(0)
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (M, 1)
        q = (rows / row_scale).round_().to(torch.int8)  # (M, K) in [-127, 127]
        if M % ROW_BUCKET:  # zero rows up to a bucket: oneDNN builds a kernel per shape, and a decoder's
            q = F.pad(q, (0, 0, 0, ROW_BUCKET - M % ROW_BUCKET))  # row count changes at every step
        y = torch._int_mm(q, self.weight_t)[:M].float().mul_(row_scale)  # (M, N), exact int32 products
        return y.mul_(self.scale) if self.bias is None else torch.addcmul(self.bias, y, self.scale)


def _prepack(q: Tensor, scale: Tensor, engine: str) -> object:
    """int8 weights (N, K) with per-row `scale`, packed for `engine` (fbgemm | qnnpack)."""
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the quantised tensor API's deprecation notice
            zero = torch.zeros(q.size(0), dtype=torch.long)
            w = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
            return torch.ops.quantized.linear_prepack(w, None)
    finally:
        torch.backends.quantized.engine = previous


def _replace_modules(model: torch.nn.Module, kind: type, make: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
    """Every submodule of exactly type `kind` replaced by `make(module)`, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make(child))

"""Device choice, numeric precision and CPU threads: the one place for all three.

Precision policy (weights and optimizer state always stay fp32):

- ``fp32``: no autocast.
- ``bf16``: ``torch.autocast`` with bfloat16 on CPU or CUDA; no loss scaling needed.
- ``fp16``: ``torch.autocast`` with float16, CUDA only, with a ``GradScaler``.
- ``auto``: bf16 where the hardware multiplies bf16 natively (a CUDA GPU with bf16; on a CPU,
  where a timed bf16 matmul beats fp32), else fp32. On an AVX2-only CPU, bf16 matmuls are
  emulated and run about 100x slower than fp32, so auto never picks them there.

Decoding (`inference_model`) converts the model itself instead of autocasting: ``bf16``/``fp16``
cast the weights once (autocast would re-cast every weight at every decoding step), ``int8``
turns every linear layer into an `Int8Linear` (int8 weights; activations quantised per call and
per row, so that outputs do not depend on the batch; CPU), the tied output projection included.
``auto`` for decoding is the precision whose timed probe — the model's own FFN shape, fp32 vs
bf16 vs int8 — runs fastest on this machine.

Measurements ("probes") are cached per process and on disk (``$NMT_CACHE_DIR`` or
``~/.cache/nmt/probes.json``), keyed by CPU model, torch version, threads and shape, so that a
choice is stable across processes on one machine (a resumed training picks the same kernels).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.errors import NmtError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' → cuda if available else cpu; 'cpu', 'cuda', 'cuda:N' are checked."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise NmtError(f"train.device: {name!r} is not a device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise NmtError(f"train.device: {name!r} requested but CUDA is not available (use auto or cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise NmtError(f"train.device: {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise NmtError(f"train.device: {name!r} is not supported (use auto, cpu, cuda or cuda:N)")
    return device


def fast_bf16_available(device: torch.device) -> bool:
    """True when bf16 matmuls run natively (not emulated) on `device`: CUDA's own report; on a CPU,
    a timed 256×256×256 matmul in bf16 beats fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return probe("cpu-bf16-matmul", _bf16_beats_fp32)


def _bf16_beats_fp32() -> bool:
    a = torch.randn(256, 256)
    times = {dtype: best_time(lambda x=a.to(dtype): x @ x) for dtype in (torch.float32, torch.bfloat16)}
    return times[torch.bfloat16] < times[torch.float32]


# --------------------------------------------------------------------------- timed probes


def best_time(fn: Callable[[], object], repeats: int = 5, inner: int = 3) -> float:
    """Seconds per call of `fn`: the best of `repeats` timings of `inner` calls, after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name ('AMD EPYC 9454 48-Core Processor'), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _probe_file() -> Path:
    root = os.environ.get("NMT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nmt"
    return Path(root) / "probes.json"


_PROBES: dict[str, object] = {}


def probe(name: str, measure: Callable[[], object]) -> object:
    """The result of `measure()` for this machine (JSON-serialisable), measured once: cached per
    process and on disk under a key of `name`, the CPU model, the torch version and the threads."""
    key = f"{name} | {cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    if key in _PROBES:
        return _PROBES[key]
    path = _probe_file()
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    if key not in stored:
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
            stored[key] = measure()
        with contextlib.suppress(OSError):
            from nmt.runs import atomic_write_json

            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, stored)
    _PROBES[key] = stored[key]
    return stored[key]


def resolve_precision(device: torch.device, precision: str) -> str:
    """'auto' → 'bf16' where it is fast on `device`, else 'fp32'; other values unchanged."""
    if precision != "auto":
        return precision
    return "bf16" if fast_bf16_available(device) else "fp32"


# --------------------------------------------------------------------------- decoding precision


def resolve_inference_precision(device: torch.device, precision: str, shape: tuple[int, int] = (512, 2048)) -> str:
    """The precision a model decodes in. 'auto': on a CPU the fastest measured of fp32, bf16 and
    int8 for a model whose d_model × ffn_dim is `shape`; on CUDA bf16 (fp16 without bf16 support).
    Other values are checked against the device and returned. NmtError for impossible requests."""
    if precision not in INFERENCE_PRECISIONS:
        raise NmtError(f"--precision {precision!r}: expected one of {' | '.join(INFERENCE_PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        d_model, ffn_dim = shape
        return str(probe(f"cpu-decode-precision {d_model}x{ffn_dim}", lambda: _fastest_precision(d_model, ffn_dim)))
    if precision == "int8" and device.type != "cpu":
        raise NmtError(f"--precision int8: int8 decoding runs on CPU only, not {device.type} (use bf16)")
    if precision == "fp16" and device.type != "cuda":
        raise NmtError("--precision fp16 needs a CUDA device; use bf16 or int8 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise NmtError("--precision bf16: this GPU has no bf16 support; use fp16")
    return precision


def _fastest_precision(d_model: int, ffn_dim: int) -> str:
    """Time one FFN of the model's shape on 64 rows (a decoding step's batch) in fp32, bf16, int8."""
    ffn = torch.nn.Sequential(torch.nn.Linear(d_model, ffn_dim), torch.nn.ReLU(), torch.nn.Linear(ffn_dim, d_model))
    x = torch.randn(64, d_model)
    times = {}
    with torch.no_grad():
        for precision in ("fp32", "bf16", "int8"):
            model = inference_model(_copy(ffn), torch.device("cpu"), precision)
            inp = x.to(torch.bfloat16) if precision == "bf16" else x
            times[precision] = best_time(lambda m=model, i=inp: m(i))
    return min(times, key=lambda p: times[p])


def _copy(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module)


def inference_model(model: torch.nn.Module, device: torch.device, precision: str) -> torch.nn.Module:
    """`model` on `device` in eval mode, converted for decoding in the resolved `precision`:
    bf16/fp16 weights cast once, int8 linear layers (`quantize_int8`); on a CPU, fp32 and
    bf16 linear layers get weights pre-packed for oneDNN (`pack_linears`)."""
    model = model.to(device).eval()
    if not isinstance(model, torch.nn.Module):  # a duck-typed decoding model (tests): used as it is
        return model
    if precision in ("bf16", "fp16"):
        model = model.to(autocast_dtype(precision))
    if precision == "int8":
        return quantize_int8(model)
    if device.type == "cpu" and precision in ("fp32", "bf16"):
        return pack_linears(model)
    return model


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` (CPU, fp32 or bf16) whose weight is laid out for oneDNN once, at load, instead
    of at every call: the same function up to summation order, 10-70% faster for the few-row
    matmuls of decoding (most for the vocabulary projection)."""

    def __init__(self, linear: torch.nn.Linear, rows_hint: int = 64) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.op = torch.ops.mkldnn._linear_pointwise.default  # the overload: no Python dispatch checks
        self.post_op = "none"  # "relu": relu(linear(x)) in the kernel's epilogue (`fuse_relu`)

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, self.packed, self.bias, self.post_op, [], "")


def packing_works() -> bool:
    """True when this torch build has oneDNN's pre-packed linear operators (private API: checked)."""
    try:
        layer = torch.nn.Linear(8, 4)
        x = torch.randn(2, 8)
        with torch.no_grad():
            return bool(torch.allclose(PackedLinear(layer)(x), layer(x), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def pack_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Every `nn.Linear` of `model` (after `split_projections`, where the model has it) as a
    `PackedLinear`, in place; the model unchanged where packing is not available."""
    if not packing_works():
        return model
    if hasattr(model, "split_projections"):
        model.split_projections()
    _replace_modules(model, torch.nn.Linear, PackedLinear)
    fuse_relu(model)
    return model


def fuse_relu(model: torch.nn.Module) -> None:
    """Every ReLU feed-forward block whose `fc1` is a `PackedLinear` applies the ReLU inside
    fc1's kernel (one pass over the (R, ffn_dim) activations fewer; the same outputs)."""
    from nmt.model import FeedForward

    for module in model.modules():
        if isinstance(module, FeedForward) and isinstance(module.fc1, PackedLinear) and module.act is F.relu:
            module.fc1.post_op, module.act = "relu", _unchanged


def _unchanged(x: Tensor) -> Tensor:
    return x


ROW_BUCKET = 16  # `Int8Linear` pads its rows to a multiple of this


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Every `nn.Linear` as an `Int8Linear`, in place. A model with `split_projections` (the
    Transformer) first exposes its weight slices and its tied output projection as linear layers,
    so that they are quantised too."""
    if hasattr(model, "split_projections"):
        model.split_projections()
    _replace_modules(model, torch.nn.Linear, Int8Linear)
    return model


class Int8Linear(torch.nn.Module):
    """A linear layer in int8: weights quantised once with one scale per output feature, inputs
    at each call with one scale per row, multiplied exactly in int32 (`torch._int_mm`) and scaled
    back to fp32. One scale per row keeps every row's output independent of the other rows, so a
    sentence translates the same whichever sentences share its batch; torch's dynamic int8 layer
    quantises a whole batch with one scale, and its outputs changed with the batch."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()  # (N, K)
        self.scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
        self.weight_t = torch.round(w / self.scale[:, None]).to(torch.int8).t()  # (K, N), int8 in [-127, 127]
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (M, K)
        M = rows.size(0)
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (M, 1)
        q = (rows / row_scale).round_().to(torch.int8)  # (M, K) in [-127, 127]
        if M % ROW_BUCKET:  # zero rows up to a bucket: oneDNN builds a kernel per shape, and a decoder's
            q = F.pad(q, (0, 0, 0, ROW_BUCKET - M % ROW_BUCKET))  # row count changes at every step
        y = torch._int_mm(q, self.weight_t)[:M].float().mul_(row_scale)  # (M, N), exact int32 products
        y = y.mul_(self.scale) if self.bias is None else torch.addcmul(self.bias, y, self.scale)
        return y.view(*x.shape[:-1], self.out_features)


def _replace_modules(model: torch.nn.Module, kind: type, make: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
    """Every submodule of exactly type `kind` replaced by `make(module)`, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make(child))


def check_precision(device: torch.device, precision: str) -> None:
    """Raise NmtError for a precision the device cannot train in."""
    precision = resolve_precision(device, precision)
    if precision not in PRECISIONS:
        raise NmtError(f"train.precision: {precision!r} is not one of {' | '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise NmtError("train.precision: fp16 needs a CUDA device; use bf16 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise NmtError("train.precision: this GPU has no bf16 support; use fp16")


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"auto": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Mixed-precision context for forward passes; a no-op for fp32."""
    check_precision(device, precision)
    dtype = autocast_dtype(resolve_precision(device, precision))
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A GradScaler that is enabled only for fp16 (disabled scalers pass everything through)."""
    check_precision(device, precision)
    return torch.amp.GradScaler(device.type, enabled=resolve_precision(device, precision) == "fp16")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_threads(n: int) -> None:
    """Torch intra-op threads; 0 = every core this process may use."""
    if n < 0:
        raise NmtError(f"train.threads: {n} must be >= 0")
    torch.set_num_threads(n if n > 0 else available_cores())


def describe(device: torch.device, precision: str) -> str:
    """One line for logs: 'cpu (4 threads), bf16' or 'cuda:0 NVIDIA H100, fp16'."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = f"cuda:{index} {torch.cuda.get_device_name(index)}"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    resolved = resolve_precision(device, precision)
    return f"{where}, {resolved}" + (" (auto)" if precision == "auto" else "")

"""The device, training precision and threads: what `nmt train` runs on and in.

Precision policy (weights and optimizer state always stay fp32):

- ``fp32``: no autocast.
- ``bf16``: ``torch.autocast`` with bfloat16 on CPU or CUDA; no loss scaling needed.
- ``fp16``: ``torch.autocast`` with float16, CUDA only, with a ``GradScaler``.
- ``auto``: bf16 where the hardware multiplies bf16 natively (a CUDA GPU with bf16; on a CPU,
  where a timed bf16 matmul beats fp32), else fp32. On an AVX2-only CPU, bf16 matmuls are
  emulated and far slower than fp32, so auto never picks them there; an explicit bf16 there
  trains, with one warning line.

`training_precision` resolves ``train.precision`` once per training process (the training loop
calls it at set-up) into fp32, bf16 or fp16, and that value is passed down: `autocast`,
`grad_scaler` and `describe` take it resolved and never look at ``auto``. The resolved value
depends on the host, so it is never written into the run's config.

Decoding converts the model itself instead of autocasting; its precision is chosen in
`nmt.decode.precision`. bf16 is used only where `nmt.hw.host` found that it runs, and its timing
is a probe (`nmt.hw.host.probe`: cached per process and on disk, keyed by the CPU and the kernels
it runs), so that a choice is stable across processes on one machine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

from nmt.errors import NmtError, warn_once
from nmt.hw import host
from nmt.hw.cores import available_cores
from nmt.hw.host import interleaved_times, probe, spread, steady

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
RESOLVED = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # what auto becomes → autocast dtype


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
    a timed 256×256×256 matmul in bf16 beats fp32 (never where bf16 matmuls do not run at all, nor
    where the machine was too busy to time it: then fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if not host.current().has("matmul-bf16"):
        return False
    fallback = ({"times": {}}, "training's precision auto takes fp32")
    times = probe("cpu-bf16-matmul times", _matmul_times, check=steady, fallback=fallback)["times"]
    return {"fp32", "bf16"} <= set(times) and times["bf16"] < times["fp32"]


def _matmul_times() -> dict[str, object]:
    """{"times": seconds of ten 256×256×256 matmuls in fp32 and in bf16, "spread"}, interleaved."""
    a = torch.randn(256, 256)

    def tenfold(x: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            for _ in range(10):
                x @ x

        return run

    times = interleaved_times({"fp32": tenfold(a), "bf16": tenfold(a.to(torch.bfloat16))}, 5)
    return {"times": {name: min(t) for name, t in times.items()}, "spread": max(map(spread, times.values()))}


def training_precision(device: torch.device, precision: str) -> str:
    """THE resolution of ``train.precision`` on `device`: 'auto' → 'bf16' where it is fast there,
    else 'fp32'; an explicit value checked (`check_precision`) and returned."""
    if precision == "auto":
        return "bf16" if fast_bf16_available(device) else "fp32"
    check_precision(device, precision)
    return precision


def check_precision(device: torch.device, precision: str) -> None:
    """Raise NmtError for a precision the device cannot train in; one warning line (once) for bf16
    on a CPU where it runs emulated, far slower than fp32. 'auto' passes: it never resolves to a
    precision the device cannot run."""
    if precision == "auto":
        return
    if precision not in PRECISIONS:
        raise NmtError(f"train.precision: {precision!r} is not one of {' | '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise NmtError("train.precision: fp16 needs a CUDA device; use bf16 on CPU")
    if precision == "bf16" and device.type == "cpu":
        here = host.current()
        if not here.has("matmul-bf16"):
            raise NmtError(f"train.precision: bf16 does not run on this CPU ({here.why_not('matmul-bf16')}); use fp32")
        if not fast_bf16_available(device):
            warn_once(f"train.precision bf16 is emulated on this CPU ({here.describe()}), slower than fp32")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise NmtError("train.precision: this GPU has no bf16 support; use fp16")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (`training_precision`); None for fp32."""
    if precision not in RESOLVED:
        raise ValueError(f"{precision!r} is not a resolved training precision (see training_precision)")
    return RESOLVED[precision]


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Mixed-precision context for forward passes in a resolved `precision`; a no-op for fp32."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def matmul_row_bucket(device: torch.device, precision: str, max_tokens: int) -> int:
    """The token-row bucket of training's linear layers (`nmt.model.row_buckets`) on `device` in a
    resolved `precision`: on a CPU in bf16, max_tokens / 8 rounded up to a multiple of 64, so that
    oneDNN makes its matmul kernels for at most ~8 row counts per layer instead of one per batch
    shape; 0 (no padding) elsewhere: fp32 runs through MKL, CUDA through cuBLAS, neither of which
    pays per shape."""
    if device.type != "cpu" or autocast_dtype(precision) != torch.bfloat16:
        return 0
    return max(64, -(-max_tokens // 8 // 64) * 64)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for a resolved `precision` of fp16 (disabled scalers pass
    everything through)."""
    autocast_dtype(precision)  # a resolved precision
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


KERNEL_CACHE = "128"  # oneDNN primitives a training process keeps (oneDNN's own default: 1,024)


def bound_kernel_cache() -> None:
    """Cap oneDNN's primitive cache at KERNEL_CACHE primitives for this process and its children,
    unless ONEDNN_PRIMITIVE_CACHE_CAPACITY is set. oneDNN keeps one primitive, with its packed
    (bf16) weights, per distinct matmul shape; a trainer's batches come in many shapes, so its
    anonymous memory grew with that cache for the whole run, while 128 kept the speed of the
    default (docs/benchmarks-log.md). oneDNN reads the variable when it makes its first
    primitive: call this before any kernel runs (the training commands do, first thing)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", KERNEL_CACHE)


def set_threads(n: int) -> None:
    """Torch intra-op threads; 0 = every core this process may use."""
    if n < 0:
        raise NmtError(f"train.threads: {n} must be >= 0")
    torch.set_num_threads(n if n > 0 else available_cores())


def describe(device: torch.device, precision: str, configured: str) -> str:
    """One line for logs: 'cpu (4 threads), bf16 (auto)' or 'cuda:0 NVIDIA H100, fp16': the
    resolved `precision`, marked (auto) where the config said so (`configured`)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = f"cuda:{index} {torch.cuda.get_device_name(index)}"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    return f"{where}, {precision}" + (" (auto)" if configured == "auto" else "")

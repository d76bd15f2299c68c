"""Device choice, numeric precision and CPU threads: the one place for all three.

Precision policy (weights and optimizer state always stay fp32):

- ``fp32``: no autocast.
- ``bf16``: ``torch.autocast`` with bfloat16 on CPU or CUDA; no loss scaling needed.
- ``fp16``: ``torch.autocast`` with float16, CUDA only, with a ``GradScaler``.
- ``auto``: bf16 where the hardware multiplies bf16 natively (a CUDA GPU with bf16, or a CPU
  with AVX512-BF16 or AMX), else fp32. On an AVX2-only CPU, bf16 matmuls are emulated and
  run about 100x slower than fp32, so auto never picks them there.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

from nmt.errors import NmtError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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
    """True when bf16 matmuls run natively (not emulated) on `device`."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return _cpu_has_bf16()


@functools.lru_cache(maxsize=1)
def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return any(flag in flags for flag in _CPU_BF16_FLAGS)


def resolve_precision(device: torch.device, precision: str) -> str:
    """'auto' → 'bf16' where it is fast on `device`, else 'fp32'; other values unchanged."""
    if precision != "auto":
        return precision
    return "bf16" if fast_bf16_available(device) else "fp32"


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

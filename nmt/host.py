"""What this machine can run: every hardware-dependent kernel, tried once, with the reason when not.

CPUs differ in ways a name does not tell: an AVX2-only x86 core has no bf16 weight packing in
oneDNN, a CPU without AVX2 has no fbgemm, an aarch64 build has no oneDNN packed linear layers.
Rather than guess from flags, each kernel below is *tried* on a tiny input the first time
anything asks (`current().has(name)`); a kernel that raises is recorded as missing, with the
first line of its error as the reason. Every fast path asks here before it is used, and falls
back to plain PyTorch when its kernel is missing.

Kernels (name: what needs it; what happens without it):

- ``pack-fp32``: oneDNN pre-packed fp32 linear layers for decoding (x86 with mkldnn); without
  it, plain ``nn.Linear``.
- ``pack-bf16``: the same in bf16 (oneDNN needs avx512bw+vl+dq or avx_ne_convert); without it,
  bf16 decoding casts weights and runs unpacked ``nn.Linear``, which is emulated and slow.
- ``matmul-bf16``: any bf16 matmul at all (bf16 autocast in training, bf16 decoding); without
  it, bf16 is refused with a one-line error and ``auto`` never picks it.
- ``int8-fbgemm`` / ``int8-qnnpack``: PyTorch's dynamic int8 linear on the fbgemm engine (x86
  with AVX2) or QNNPACK (ARM); ``int8-onednn``: ``torch._int_mm`` (fast with AVX-512 VNNI or AMX,
  a slow reference loop on AVX2); ``int8-weight``: weight-only int8 with bf16 activations,
  ``torch.ops.aten._weight_int8pack_mm`` (it streams one byte per weight, the fastest for the
  one-row steps of a sentence decoded alone). int8 decoding uses the fastest one measured here
  (`nmt.device`); with none, int8 is refused and ``auto`` never picks it.

Tests and users simulate a host without some kernels through ``NMT_HOST_WITHOUT`` (a comma list
of kernel names or of the presets in `PRESETS`, e.g. ``NMT_HOST_WITHOUT=avx2-only``), which
child processes inherit; `forget()` drops the cached detection after the variable changes.
`nmt doctor` prints the table.

Measurements of what runs fastest here (`probe`) live here too, keyed by the host's fingerprint.
This module imports nothing of nmt but `nmt.files`: everything that depends on the CPU can ask it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nmt.files import atomic_write_json

KERNELS: dict[str, str] = {
    "pack-fp32": "oneDNN pre-packed fp32 linear (decoding)",
    "pack-bf16": "oneDNN pre-packed bf16 linear (decoding)",
    "matmul-bf16": "bf16 matmul (training autocast, bf16 decoding)",
    "int8-fbgemm": "fbgemm dynamic int8 linear (x86 with AVX2)",
    "int8-qnnpack": "QNNPACK dynamic int8 linear (ARM)",
    "int8-onednn": "oneDNN int8 matmul, torch._int_mm",
    "int8-weight": "weight-only int8 matmul, bf16 activations (torch._weight_int8pack_mm)",
}

# Hosts we do not have, as the kernels they lack (checked against real machines: an AMD EPYC
# Zen 3 without AVX-512 has every kernel but pack-bf16).
PRESETS: dict[str, tuple[str, ...]] = {
    "avx2-only": ("pack-bf16",),
    "no-avx2": ("pack-bf16", "int8-fbgemm"),
    "aarch64": ("pack-fp32", "pack-bf16", "int8-fbgemm", "int8-onednn", "int8-weight"),
    "bare": tuple(KERNELS),
}
ENV = "NMT_HOST_WITHOUT"


@dataclass(frozen=True)
class Host:
    """This machine: its CPU, its instruction-set flags, and why each missing kernel is missing."""

    cpu: str
    flags: frozenset[str]
    missing: Mapping[str, str] = field(default_factory=dict)  # kernel name -> reason

    def has(self, kernel: str) -> bool:
        if kernel not in KERNELS:
            raise KeyError(f"unknown kernel {kernel!r} (one of {', '.join(KERNELS)})")
        return kernel not in self.missing

    def why_not(self, kernel: str) -> str:
        return self.missing.get(kernel, "")

    @property
    def fingerprint(self) -> str:
        """The CPU and the kernels that run: what a cached measurement is valid for."""
        return f"{self.cpu} [{','.join(k for k in KERNELS if self.has(k))}]"

    def describe(self) -> str:
        """'AMD EPYC (AVX2, no AVX-512)': the CPU and its widest vector extension, for logs."""
        if "avx512f" in self.flags:
            isa = "AVX-512" + (" + bf16" if "avx512_bf16" in self.flags or "amx_bf16" in self.flags else "")
        elif "avx2" in self.flags:
            isa = "AVX2, no AVX-512"
        else:
            isa = platform.machine()
        return f"{self.cpu} ({isa})"


def current() -> Host:
    """The host as detected once per process (`NMT_HOST_WITHOUT` applied)."""
    return _detect(os.environ.get(ENV, ""))


def forget() -> None:
    """Drop the cached detection and measurements (after changing `NMT_HOST_WITHOUT`, or
    monkeypatching a kernel to fail)."""
    _detect.cache_clear()
    _PROBES.clear()


@functools.lru_cache(maxsize=4)
def _detect(without: str) -> Host:
    missing = {name: reason for name in KERNELS if (reason := _try(_TRIALS[name]))}
    for name in _expand(without):
        missing[name] = f"disabled by {ENV}={without}"
    return Host(cpu_model(), cpu_flags(), missing)


def _expand(without: str) -> list[str]:
    names: list[str] = []
    for item in filter(None, (part.strip() for part in without.split(","))):
        if item not in PRESETS and item not in KERNELS:
            choices = ", ".join([*PRESETS, *KERNELS])
            raise ValueError(f"{ENV}: unknown kernel or preset {item!r} (one of {choices})")
        names.extend(PRESETS.get(item, (item,)))
    return names


def _try(trial: Callable[[], object]) -> str:
    """'' when `trial()` runs, else the first line of what it raised."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # deprecation notices of the quantised tensor API
            trial()
    except Exception as e:  # noqa: BLE001 — any failure means "not here"; the reason is kept
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return ""


def _pack(dtype: torch.dtype) -> None:
    w, x = torch.randn(16, 32, dtype=dtype), torch.randn(4, 32, dtype=dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
    torch.ops.mkldnn._linear_pointwise.default(x, packed, None, "none", [], "")


def _bf16_matmul() -> None:
    a = torch.randn(8, 8, dtype=torch.bfloat16)
    _ = a @ a


def _quantized_engine(engine: str) -> Callable[[], None]:
    def trial() -> None:
        if engine not in torch.backends.quantized.supported_engines:
            raise RuntimeError(f"this torch build has no {engine} engine")
        w = torch.randn(16, 32)
        scale = (w.abs().amax(1) / 127).double()
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = engine
            qw = torch.quantize_per_channel(w, scale, torch.zeros(16, dtype=torch.long), 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(qw, None)
        finally:
            torch.backends.quantized.engine = previous
        torch.ops.quantized.linear_dynamic(torch.randn(4, 32), packed, engine == "fbgemm")

    return trial


def _int_mm() -> None:
    torch._int_mm(torch.ones(16, 32, dtype=torch.int8), torch.ones(32, 16, dtype=torch.int8))


def _weight_int8() -> None:
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.ones(16, 32, dtype=torch.int8)
    torch.ops.aten._weight_int8pack_mm(x, w, torch.full((16,), 0.01, dtype=torch.bfloat16))


_TRIALS: dict[str, Callable[[], object]] = {
    "pack-fp32": lambda: _pack(torch.float32),
    "pack-bf16": lambda: _pack(torch.bfloat16),
    "matmul-bf16": _bf16_matmul,
    "int8-fbgemm": _quantized_engine("fbgemm"),
    "int8-qnnpack": _quantized_engine("qnnpack"),
    "int8-onednn": _int_mm,
    "int8-weight": _weight_int8,
}


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name ('AMD EPYC 9454 48-Core Processor'), else the machine type."""
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists (x86 'flags', ARM 'Features'); empty elsewhere."""
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError:
        return []


def table() -> list[tuple[str, str, str]]:
    """(kernel, what it is, 'yes' or the reason it is missing) for each kernel: `nmt doctor`."""
    host = current()
    return [(name, what, "yes" if host.has(name) else f"no: {host.why_not(name)}") for name, what in KERNELS.items()]


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


def _probe_file() -> Path:
    root = os.environ.get("NMT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nmt"
    return Path(root) / "probes.json"


_PROBES: dict[str, object] = {}


def probe(name: str, measure: Callable[[], object], notice: str = "") -> object:
    """The result of `measure()` for this machine (JSON-serialisable), measured once: cached per
    process and on disk under a key of `name`, the host's fingerprint (CPU and the kernels that
    run), the torch version and the threads. Two hosts of one CPU name with different kernels
    (a VM that hides AVX-512, a simulated host) never share a measurement. `notice`: a line for
    stderr when it is measured (a probe that takes seconds says why the command pauses)."""
    key = f"{name} | {current().fingerprint} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    if key in _PROBES:
        return _PROBES[key]
    path = _probe_file()
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    if key in stored:
        _PROBES[key] = stored[key]
        return stored[key]
    if notice:
        print(f"{notice} (once for this machine; cached in {path})", file=sys.stderr)
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        _PROBES[key] = measure()
    with contextlib.suppress(OSError, ValueError):  # re-read: `measure` may have stored probes of its own
        stored = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        atomic_write_json(path, {**stored, key: _PROBES[key]})
    return _PROBES[key]

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
  (`nmt.decode.precision`); with none, int8 is refused and ``auto`` never picks it.

Tests and users simulate a host without some kernels through ``NMT_HOST_WITHOUT`` (a comma list
of kernel names or of the presets in `PRESETS`, e.g. ``NMT_HOST_WITHOUT=avx2-only``), which
child processes inherit; `forget()` drops the cached detection after the variable changes.
`nmt doctor` prints the table.

Measurements of what runs fastest here (`probe`) live here too, keyed by the host's fingerprint
and stamped with what else changes them (`stamp`: torch and CTranslate2 versions, the variables
that choose kernels, the file's layout). A stale or malformed entry is measured again, and so is
a fresh measurement that its caller's check rejects (a busy machine: `interleaved_times` and
`spread` give the caller what to judge by), a bounded number of times; `refresh` drops this
host's entries (`nmt doctor --refresh`).
This module imports nothing of nmt but `nmt.files`: everything that depends on the CPU can ask it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import math
import os
import platform
import statistics
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
    """`torch._int_mm` must run *and* be exact: under a oneDNN without VNNI (AVX2, or AVX-512
    capped below VNNI by ONEDNN_MAX_CPU_ISA) it multiplies through int16 pairs that saturate, and
    full-range int8 products come out wrong by thousands."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (16, 64), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (64, 16), dtype=torch.int8, generator=gen)
    got, exact = torch._int_mm(a, b), a.int() @ b.int()
    if not torch.equal(got, exact):
        off = int((got - exact).abs().max())
        raise RuntimeError(f"torch._int_mm gives wrong int32 products here (off by up to {off}: no VNNI in oneDNN)")


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


HOPELESS = 5.0  # a candidate this many times slower than the best one is not timed past its second run


def interleaved_times(candidates: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call of each candidate, timed in `rounds` interleaved rounds (every
    candidate once, then again) after one warm-up call each, so that a load that comes and goes
    slows every candidate alike rather than the one timed at that moment. A candidate whose best
    after two runs is `HOPELESS` × the best of all is not run again (an emulated bf16 or a
    reference int8 loop costs two slow runs, not `rounds`)."""
    for run in candidates.values():
        run()  # first-call work (kernel set-up, caches) is not what a call costs
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for round_ in range(rounds):
        best = min((min(t) for t in times.values() if t), default=math.inf)
        for name, run in candidates.items():
            if round_ >= 2 and min(times[name]) > HOPELESS * best:
                continue
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def spread(times: list[float]) -> float:
    """The median of `times` over their best (1.0: every repeat took as long as the best)."""
    return statistics.median(times) / min(times)


# --------------------------------------------------------------------------- the probe cache

NOISY = 1.5  # repeats whose median is this many times their best were slowed by other work (see `steady`)


def steady(measured: dict) -> str:
    """'' when the repeats of every candidate agreed, else why not. On an idle machine the runs of
    one candidate differ by a few percent (caches, clock changes); a median `NOISY` × the best
    means that most runs were slowed by other work on the cores, which does not slow every
    candidate alike, so their ratios are not the kernels'."""
    positive_times(measured)
    noise = float(measured["spread"])
    return f"its repeats disagree (median {noise:.1f}x the best: a busy machine)" if noise > NOISY else ""


def positive_times(measured: dict) -> dict[str, float]:
    """The "times" of a measurement, checked: names to positive seconds (TypeError otherwise)."""
    times = measured["times"]
    if not isinstance(times, dict) or not all(isinstance(t, int | float) and t > 0 for t in times.values()):
        raise TypeError(f"times must map names to positive seconds, not {times!r}")
    return times


SCHEMA = 2  # the layout of probes.json; a file of another layout is measured anew and rewritten
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # variables that change which kernels PyTorch runs
MEASURE_TRIES = 3  # measurements of one probe before a result that fails its check is given up on


def probe_file() -> Path:
    root = os.environ.get("NMT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nmt"
    return Path(root) / "probes.json"


def stamp() -> dict[str, object]:
    """What a measurement depends on besides the CPU and its kernels (which are in its key): the
    cache layout, the torch and CTranslate2 versions (the version of the package, read without
    importing it: '' where it is not installed) and the environment variables that choose kernels."""
    return {
        "schema": SCHEMA,
        "torch": torch.__version__,
        "ctranslate2": _installed_version("ctranslate2"),
        **{name: os.environ.get(name, "") for name in KERNEL_ENV},
    }


def describe_stamp() -> str:
    """`stamp()` in words, for `nmt doctor`: 'torch 2.13.0, ctranslate2 4.6.0, ATEN_CPU_CAPABILITY=avx2'."""
    now = stamp()
    words = [f"{name} {now[name] or 'not installed'}" for name in ("torch", "ctranslate2")]
    return ", ".join(words + [f"{name}={now[name]}" for name in KERNEL_ENV if now[name]])


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


_PROBES: dict[str, object] = {}
_MISSING = object()


def probe(
    name: str,
    measure: Callable[[], object],
    notice: str = "",
    check: Callable[[object], str] | None = None,
    fallback: tuple[object, str] | None = None,
) -> object:
    """The result of `measure()` for this machine (JSON-serialisable), measured once: cached per
    process and on disk under a key of `name`, the host's fingerprint (CPU and the kernels that
    run) and the threads, stamped with `stamp()`. Two hosts of one CPU name with different kernels
    (a VM that hides AVX-512, a simulated host) never share a measurement.

    A cached result is measured again when its stamp differs from this process's (another torch
    or CTranslate2, another kernel variable), when the file or the entry is malformed, or when
    `check` rejects it; the new result replaces it (the file rewritten atomically).
    `check(result)`: '' for a usable result, else why not (wrong types, or a measurement no
    kernel can produce, or repeats that disagree: a busy machine). A fresh result it rejects is
    measured again, up to `MEASURE_TRIES` times; then `fallback` (value, what it means) is used for
    this process only, with one line on stderr (without `fallback`, the last result). `notice`: a
    line for stderr when it is measured (a probe that takes seconds says why the command pauses)."""
    key = f"{name} | {current().fingerprint} | {torch.get_num_threads()} threads"
    if key in _PROBES:
        return _PROBES[key]
    path = probe_file()
    entries, why = _read_probes(path)
    why = why or _unusable(entries.get(key, _MISSING), check)
    if not why:
        _PROBES[key] = entries[key]["result"]
        return _PROBES[key]
    if notice:
        print(f"{notice} ({why}; cached in {path})", file=sys.stderr)
    result, trouble = _measure(measure, check)
    if trouble and fallback is not None:
        print(f"warning: {name}: {trouble} in {MEASURE_TRIES} measurements; {fallback[1]}", file=sys.stderr)
        _PROBES[key] = fallback[0]
        return fallback[0]
    _PROBES[key] = result
    with contextlib.suppress(OSError):  # re-read: `measure` may have stored probes of its own
        entries = _read_probes(path)[0]
        entry = {"host": current().fingerprint, "stamp": stamp(), "result": result}
        atomic_write_json(path, {"schema": SCHEMA, "probes": {**entries, key: entry}})
    return result


def _measure(measure: Callable[[], object], check: Callable[[object], str] | None) -> tuple[object, str]:
    """(the first result `check` accepts, ''), else (the last one, why `check` rejected it)."""
    trouble = ""
    for _ in range(MEASURE_TRIES):
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
            result = measure()
        trouble = _verdict(check, result)
        if not trouble:
            break
    return result, trouble


def _verdict(check: Callable[[object], str] | None, result: object) -> str:
    """`check(result)`, with a result of the wrong shape (one that makes `check` raise) rejected."""
    if check is None:
        return ""
    try:
        return check(result)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as e:
        return f"a malformed result ({type(e).__name__}: {e})"


def _read_probes(path: Path) -> tuple[dict[str, dict], str]:
    """(the entries of the probe file at `path`, '') — or ({}, why none can be used: unreadable,
    not JSON, another layout). A missing file is no entries and no complaint."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as e:
        return {}, f"the cache file is unreadable: {type(e).__name__}"
    if not isinstance(stored, dict) or stored.get("schema") != SCHEMA or not isinstance(stored.get("probes"), dict):
        return {}, "the cache file has another layout"
    return stored["probes"], ""


def _unusable(entry: object, check: Callable[[object], str] | None) -> str:
    """'' when a stored `entry` can be used here, else why it is measured again."""
    if entry is _MISSING:
        return "once for this machine"
    if not isinstance(entry, dict) or not isinstance(entry.get("stamp"), dict) or "result" not in entry:
        return "its cache entry is malformed"
    now = stamp()
    for field_ in now:
        if entry["stamp"].get(field_) != now[field_]:
            was = entry["stamp"].get(field_)
            return f"measured with {field_} {was or 'none'!s}, now {now[field_] or 'none'}"
    trouble = _verdict(check, entry["result"])
    return f"its cached result is unusable: {trouble}" if trouble else ""


def refresh() -> int:
    """Drop this host's measurements (its fingerprint's, at any thread count) from the process and
    from the disk cache, so that the next probes measure anew (`nmt doctor --refresh`); other
    hosts' entries stay. A cache file that cannot be read is replaced. Returns the entries dropped."""
    _PROBES.clear()
    path = probe_file()
    entries, why = _read_probes(path)
    here = current().fingerprint
    kept = {key: e for key, e in entries.items() if not (isinstance(e, dict) and e.get("host") == here)}
    if why or len(kept) < len(entries):
        atomic_write_json(path, {"schema": SCHEMA, "probes": kept})
    return len(entries) - len(kept)

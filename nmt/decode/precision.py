"""Decoding precision: which precision a model decodes in, and the timed probes that rank them.

Decoding converts the model itself instead of autocasting (`nmt.model.convert`). ``auto`` for
decoding is fp32 (`REFERENCE_PRECISION`), the output every command shares; bf16 and int8 are used when
asked for. Timed probes (`decode_times`: the model's own FFN shape, each precision this host
runs, int8 on its fastest kernel) rank them for `nmt doctor`, pick the int8 kernel and warn
about an explicit precision far slower than fp32 here.

Every kernel that depends on the CPU (oneDNN packing, bf16, the int8 kernels) is used only where
`nmt.hw.host` found that it runs; an explicit precision that cannot run here is one error line.
Measurements ("probes", `nmt.hw.host.probe`) are cached per process and on disk, keyed by the CPU
and the kernels it runs and stamped with the versions that change them, so that a choice is
stable across processes on one machine; a measurement no kernel can produce (a ratio beyond
`MAX_SPEEDUP`, repeats that disagree beyond `nmt.hw.host.NOISY`: a busy machine) is measured again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nmt import BOS_ID, EOS_ID
from nmt.config import ModelConfig
from nmt.decode.options import ALONE_ROWS, BATCH_ROWS, REFERENCE_PRECISION
from nmt.errors import NmtError, warn_once
from nmt.hw import host
from nmt.hw.host import interleaved_times, positive_times, probe, spread, steady
from nmt.model.convert import INT8_KERNELS, inference_model, int8_kernels
from nmt.model.fast_decoder import fast_decoder
from nmt.model.transformer import Transformer

INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")


def resolve_inference_precision(
    device: torch.device, precision: str, shape: tuple[int, int] = (512, 2048), rows: int = BATCH_ROWS
) -> str:
    """The precision a model decodes in. 'auto' is `REFERENCE_PRECISION` (fp32) on every device: bf16 and
    int8 change translations (a few lines in a hundred), so a default that followed the fastest
    measured precision would give `nmt eval` one answer and `nmt serve` another wherever their
    workloads measured differently; they are used when asked for. Other values are checked
    against the device and returned, with one warning line where they run far slower than fp32
    here (measured with a model of d_model × ffn_dim `shape` on steps of `rows` rows).
    NmtError for impossible requests."""
    if precision not in INFERENCE_PRECISIONS:
        raise NmtError(f"--precision {precision!r}: expected one of {' | '.join(INFERENCE_PRECISIONS)}")
    if precision == "auto":
        return REFERENCE_PRECISION
    if device.type == "cuda":
        return _cuda_precision(device, precision)
    if precision == "fp16":
        raise NmtError("--precision fp16 needs a CUDA device; use bf16 or int8 on CPU")
    runnable = cpu_precisions()
    if precision not in runnable:
        here = host.current()
        raise NmtError(
            f"--precision {precision}: this CPU ({here.describe()}) cannot run it "
            f"({_why_not(precision)}); use {' or '.join(runnable)}"
        )
    if precision != "fp32":
        _warn_if_slow(precision, decode_times(shape, rows))
    return precision


SLOW = 1.5  # an explicit precision this many times slower than fp32 gets a warning


def _warn_if_slow(precision: str, times: dict[str, float]) -> None:
    """One warning line (once) where `precision` decoded `SLOW` × slower than fp32 in `times`."""
    if precision not in times or "fp32" not in times or times[precision] <= SLOW * times["fp32"]:
        return
    fastest = min(times, key=lambda p: times[p])
    warn_once(
        f"--precision {precision} runs {times[precision] / times['fp32']:.1f}x slower than fp32 "
        f"on this CPU ({host.current().describe()}); {fastest} is the fastest here"
    )


def _cuda_precision(device: torch.device, precision: str) -> str:
    if precision == "int8":
        raise NmtError(f"--precision int8: int8 decoding runs on CPU only, not {device.type} (use bf16)")
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise NmtError("--precision bf16: this GPU has no bf16 support; use fp16")
    return precision


def cpu_precisions() -> list[str]:
    """The decoding precisions this CPU runs: fp32 always, bf16 where a bf16 matmul runs at all,
    int8 where one of the int8 kernels does (`nmt.hw.host`)."""
    here = host.current()
    return ["fp32"] + ["bf16"] * here.has("matmul-bf16") + ["int8"] * bool(int8_kernels())


def _why_not(precision: str) -> str:
    here = host.current()
    kernels = ["matmul-bf16"] if precision == "bf16" else list(INT8_KERNELS)
    return "; ".join(f"{k}: {here.why_not(k)}" for k in kernels)


# --------------------------------------------------------------------------- decoding probes

MAX_SPEEDUP = 8.0  # no precision decodes a probe this many times faster than fp32 (see `_plausible_precisions`)


def decode_times(shape: tuple[int, int], rows: int = BATCH_ROWS) -> dict[str, float]:
    """Seconds to encode a batch of `rows` sources and decode `PROBE_STEPS` steps with a small
    Transformer of the model's d_model × ffn_dim `shape` (`_probe_model`), for each precision this
    host runs (int8 on its fastest kernel), converted and driven as the native engine converts and
    drives a model; measured once per machine (`nmt.hw.host.probe`), measured again when implausible.
    Empty where no plausible measurement came (a machine busy throughout). The fastest precision
    differs with the rows: at one row a step streams every weight for matrix-vector products
    (bytes per weight and per-call work decide), at 64 rows it multiplies matrices (the kernels'
    arithmetic decides)."""
    d_model, ffn_dim = shape
    measured = probe(
        f"cpu-decode-times {d_model}x{ffn_dim} rows {rows} decoder",
        lambda: _time_precisions(d_model, ffn_dim, rows),
        f"timing the decoding precisions of a {d_model}x{ffn_dim} model on {rows}-row steps",
        check=_plausible_precisions,
        fallback=({"times": {}}, "the precisions stay unranked (auto decodes in fp32 regardless)"),
    )
    return dict(measured["times"])


def _time_precisions(d_model: int, ffn_dim: int, rows: int) -> dict[str, object]:
    """`_time_models` of the probe model converted to each precision this host runs."""
    models = {}
    for precision in cpu_precisions():
        kernel = fastest_int8_kernel((d_model, ffn_dim), rows) if precision == "int8" else ""
        models[precision] = inference_model(_probe_model(d_model, ffn_dim), _CPU, precision, kernel)
    return _time_models(models, rows)


def _plausible_precisions(measured: dict) -> str:
    """'' for precision timings that some kernel can produce, else why not: repeats that disagree
    (`steady`), or a precision more than `MAX_SPEEDUP` × faster than fp32. bf16 moves half of
    fp32's bytes and int8 a quarter, so a step that streams its weights gains at most 2× and 4×;
    where it multiplies matrices, the matmuls gain more (AMX), but the rest of a step (attention
    over the cache, norms, softmax, the argmax over the vocabulary) costs the same in every
    precision. A ratio beyond that is an fp32 run slowed by other work, not a kernel."""
    times = positive_times(measured)
    if "fp32" not in times:
        return "no fp32 time"
    for precision, seconds in times.items():
        if times["fp32"] / seconds > MAX_SPEEDUP:
            ratio = times["fp32"] / seconds
            return f"{precision} measured {ratio:.1f}x faster than fp32, more than any kernel gives"
    return steady(measured)


def fastest_int8_kernel(shape: tuple[int, int], rows: int = BATCH_ROWS) -> str:
    """The int8 kernel that decodes fastest on this host with a small Transformer of `shape` on
    `rows` rows (`int8_times`; where none was measured plausibly, the first this host runs in
    `nmt.model.convert.INT8_KERNELS`' order); '' where none runs."""
    kernels = int8_kernels()
    if len(kernels) < 2:
        return "".join(kernels)
    times = {k: t for k, t in int8_times(shape, rows).items() if k in kernels}
    return min(times, key=lambda k: times[k]) if times else kernels[0]


def int8_times(shape: tuple[int, int], rows: int = BATCH_ROWS) -> dict[str, float]:
    """Seconds per probe run (`_time_models`) of each int8 kernel this host runs, decoding with a
    small Transformer of `shape` on `rows` rows; measured once per machine, again when the
    repeats disagree; empty where they disagreed each time."""
    d_model, ffn_dim = shape

    def measure() -> dict[str, object]:
        models = {k: inference_model(_probe_model(d_model, ffn_dim), _CPU, "int8", k) for k in int8_kernels()}
        return _time_models(models, rows)

    key = f"cpu-int8-kernel {d_model}x{ffn_dim} rows {rows} decoder times"
    fallback = ({"times": {}}, f"int8 runs on {int8_kernels()[0]}, the first kernel in order")
    return dict(probe(key, measure, check=steady, fallback=fallback)["times"])


_CPU = torch.device("cpu")
PROBE_LAYERS, PROBE_VOCAB, PROBE_STEPS, PROBE_SOURCE = 3, 8000, 4, 10  # configs/small.yaml's depth


def _probe_model(d_model: int, ffn_dim: int) -> torch.nn.Module:
    """A seeded random pre-norm Transformer of `d_model` × `ffn_dim` with `PROBE_LAYERS` decoder
    layers and a `PROBE_VOCAB` vocabulary: what a decoding step reads and computes, per layer and
    in the output projection, for the shipped configs."""
    heads = next(h for h in (d_model // 64, 4, 2, 1) if h >= 1 and d_model % h == 0)
    cfg = ModelConfig(
        d_model=d_model, heads=heads, encoder_layers=1, decoder_layers=PROBE_LAYERS, ffn_dim=ffn_dim, dropout=0.0
    )
    torch.manual_seed(0)
    return Transformer(cfg, PROBE_VOCAB, PROBE_VOCAB).eval()


def _time_models(models: dict[str, torch.nn.Module], rows: int) -> dict[str, object]:
    """{"times": each model's best seconds for a `_decoding_run`, "spread": the largest median /
    best of any of them}: interleaved rounds (`nmt.hw.host.interleaved_times`), five under 16 rows
    (short, noisy runs), else three."""
    runs = {name: _decoding_run(model, rows) for name, model in models.items()}
    with torch.inference_mode():
        times = interleaved_times(runs, 5 if rows < 16 else 3)
    return {"times": {name: min(t) for name, t in times.items()}, "spread": max(map(spread, times.values()))}


def _decoding_run(model: torch.nn.Module, rows: int) -> Callable[[], None]:
    """A call that encodes `rows` seeded sources of `PROBE_SOURCE` tokens and takes `PROBE_STEPS`
    greedy steps through `fast_decoder(model)`: what the native engine runs, per step."""
    stepper = fast_decoder(model)
    src = torch.randint(4, PROBE_VOCAB, (rows, PROBE_SOURCE), generator=torch.Generator().manual_seed(0))
    src[:, -1] = EOS_ID

    def run() -> None:
        state = stepper.start_decoding(stepper.encode(src))
        tokens = torch.full((rows,), BOS_ID)
        for _ in range(PROBE_STEPS):
            tokens = stepper.decode_step(tokens, state).argmax(-1)

    return run


def decoding_model(
    model: torch.nn.Module, device: torch.device, precision: str, rows: int = BATCH_ROWS
) -> torch.nn.Module:
    """`model` converted for decoding in the resolved `precision`, with the int8 kernel measured
    fastest here for its shape on steps of `rows` rows."""
    kernel = fastest_int8_kernel(model_shape(model), rows) if precision == "int8" else ""
    return inference_model(model, device, precision, kernel)


def model_shape(model: object) -> tuple[int, int]:
    """(d_model, ffn_dim) of `model` (a Transformer or an ensemble: its `cfg`), what the probes are
    sized by; a duck-typed model without a config gets a base-sized (512, 2048)."""
    cfg = getattr(model, "cfg", None)
    return (cfg.d_model, cfg.ffn_dim) if cfg is not None else (512, 2048)


def describe_host(shape: tuple[int, int] = (256, 1024)) -> str:
    """`nmt doctor`: the host, its kernels (or why each is missing), where its probes are cached
    and the decoding precisions it runs, with their measured decoding time with a small model of
    `shape` relative to fp32, for a sentence at a time and for batches."""
    here = host.current()
    lines = [f"CPU: {here.describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads"]
    lines += [f"  {name:<13} {status}" for name, _, status in host.table()]
    auto = f"--precision auto decodes in {REFERENCE_PRECISION}"
    lines.append(f"probes: {host.probe_file()} ({host.describe_stamp()}); {auto}")
    for rows, what in ((ALONE_ROWS, "one sentence at a time"), (BATCH_ROWS, f"batches ({BATCH_ROWS} rows)")):
        times = decode_times(shape, rows)
        if "fp32" not in times:
            lines.append(f"decoding {what}: not measured (the machine was busy; run nmt doctor --refresh when idle)")
            continue
        speeds = ", ".join(f"{p} {times['fp32'] / t:.2f}x" for p, t in times.items())
        best = min(times, key=lambda p: times[p])
        kernel = f"; int8 kernel {fastest_int8_kernel(shape, rows)}" if "int8" in times else ""
        model = f"a {shape[0]}x{shape[1]} model"
        lines.append(f"decoding {what}, speed vs fp32 ({model}): {speeds}; fastest = {best}{kernel}")
    return "\n".join(lines)

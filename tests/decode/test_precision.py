"""Decoding precision (nmt/decode/precision.py): what each request resolves to on this device, and
the timed probes that rank the precisions."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.errors import NmtError

pytestmark = pytest.mark.precision


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    """Probes cached in a fresh directory and a fresh process cache."""
    from nmt.hw import host

    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(host, "_PROBES", {})
    return tmp_path


def test_inference_precision_checks_the_device(monkeypatch):
    import nmt.decode.precision
    from nmt.decode.precision import cpu_precisions, resolve_inference_precision

    monkeypatch.setattr(
        nmt.decode.precision, "decode_times", lambda shape, rows: {}
    )  # the speeds are not what is checked here
    cpu = torch.device("cpu")
    for p in cpu_precisions():
        assert resolve_inference_precision(cpu, p, (32, 64)) == p
    for bad, device in (("fp8", cpu), ("fp16", cpu), ("int8", torch.device("cuda"))):
        with pytest.raises(NmtError, match="--precision"):
            resolve_inference_precision(device, bad)


def test_decode_times_are_measured_once_and_cached_on_disk(probe_dir, monkeypatch):
    import nmt.decode.precision as precision
    from nmt.hw import host

    calls = []

    def measure(d, f, rows):
        calls.append((d, f))
        return {"times": {"fp32": 2.0, "int8": 1.0}, "spread": 1.1}

    monkeypatch.setattr(precision, "_time_precisions", measure)
    assert precision.decode_times((32, 64)) == precision.decode_times((32, 64)) == {"fp32": 2.0, "int8": 1.0}
    assert calls == [(32, 64)]  # cached in the process
    monkeypatch.setattr(host, "_PROBES", {})
    assert precision.decode_times((32, 64)) == {"fp32": 2.0, "int8": 1.0}
    assert calls == [(32, 64)]  # and on disk, keyed by machine and shape
    assert host.current().fingerprint in (probe_dir / "probes.json").read_text()
    precision.decode_times((16, 64))
    assert len(calls) == 2


def test_auto_decodes_in_fp32_whatever_the_probes_measured(probe_dir, monkeypatch):
    """`--precision auto` is the reference precision on every workload, without measuring: the
    output every command shares, even where int8 or bf16 measured faster."""
    import nmt.decode.precision as precision

    measured = []
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: measured.append(rows))
    cpu = torch.device("cpu")
    for rows in (precision.ALONE_ROWS, precision.BATCH_ROWS):
        assert (
            precision.resolve_inference_precision(cpu, "auto", (8, 16), rows) == precision.REFERENCE_PRECISION == "fp32"
        )
    assert measured == []


def test_decode_times_really_time_every_precision_this_host_runs(probe_dir, monkeypatch):
    import nmt.decode.precision as precision
    from nmt.decode.precision import cpu_precisions, decode_times
    from nmt.hw import host

    monkeypatch.setattr(host, "NOISY", math.inf)  # real timings on shared cores: kept however noisy
    monkeypatch.setattr(precision, "MAX_SPEEDUP", math.inf)
    times = decode_times((32, 64))
    assert list(times) == cpu_precisions() and all(t > 0 for t in times.values())


def test_an_explicit_precision_far_slower_than_fp32_says_so_once(probe_dir, monkeypatch, capsys):
    import nmt.decode.precision as precision

    times = {"fp32": 1.0, "bf16": 30.0, "int8": 0.5}
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, r: {"times": times, "spread": 1.0})
    monkeypatch.setattr(precision, "cpu_precisions", lambda: ["fp32", "bf16", "int8"])
    precision.warn_once.cache_clear()
    cpu = torch.device("cpu")
    assert precision.resolve_inference_precision(cpu, "bf16", (8, 16)) == "bf16"
    assert precision.resolve_inference_precision(cpu, "bf16", (8, 16)) == "bf16"
    assert precision.resolve_inference_precision(cpu, "fp32", (8, 16)) == "fp32"
    lines = capsys.readouterr().err.splitlines()
    warnings = [line for line in lines if not line.startswith("timing the decoding precisions")]  # the probe's notice
    assert len(warnings) == 1 and "bf16 runs 30.0x slower than fp32" in warnings[0]
    assert "int8 is the fastest" in warnings[0]


def test_probes_are_measured_per_workload_and_nested_probes_are_kept(probe_dir, monkeypatch):
    """The int8-kernel probe times each kernel on steps of the rows the caller decodes (one row: a
    sentence at a time; 64: batches), each its own measurement; a probe measured inside another
    (the int8 kernel inside the precision probe) is kept on disk too."""
    import nmt.decode.precision as precision
    from nmt.hw import host

    fake = {("int8-fbgemm", 1): 3.0, ("int8-weight", 1): 1.0, ("int8-fbgemm", 64): 2.0, ("int8-weight", 64): 4.0}
    seen: list[int] = []

    def time_models(models, rows):
        seen.append(rows)
        return {"times": {k: fake[k, rows] for k in models}, "spread": 1.0}

    monkeypatch.setattr(precision, "int8_kernels", lambda: ["int8-fbgemm", "int8-weight"])
    monkeypatch.setattr(precision, "inference_model", lambda model, dev, precision, kernel: kernel)
    monkeypatch.setattr(precision, "_probe_model", lambda d, f: None)
    monkeypatch.setattr(precision, "_time_models", time_models)
    assert host.probe("outer", lambda: precision.fastest_int8_kernel((8, 16), 1)) == "int8-weight"
    assert precision.fastest_int8_kernel((8, 16), precision.BATCH_ROWS) == "int8-fbgemm"
    assert seen == [1, 64]
    stored = (probe_dir / "probes.json").read_text()
    assert "cpu-int8-kernel 8x16 rows 1 " in stored and "cpu-int8-kernel 8x16 rows 64 " in stored
    assert "outer |" in stored


def test_the_probe_times_real_decoding_steps_of_a_model_of_the_shape(probe_dir, capsys, monkeypatch):
    """`_time_models` encodes and decodes through the model's FastDecoder (what the engine runs), and
    a probe that measures says so in one line on stderr, once."""
    import nmt.decode.precision as precision
    from nmt.hw import host
    from nmt.model.fast_decoder import FastDecoder

    monkeypatch.setattr(host, "NOISY", math.inf)  # real timings on shared cores: kept however noisy
    monkeypatch.setattr(precision, "MAX_SPEEDUP", math.inf)
    model = precision._probe_model(32, 64)
    assert model.cfg.d_model == 32 and model.cfg.decoder_layers == precision.PROBE_LAYERS
    steps = []
    original = FastDecoder.decode_step
    FastDecoder.decode_step = lambda self, tokens, state: steps.append(tokens.numel()) or original(self, tokens, state)
    try:
        measured = precision._time_models({"fp32": model}, 3)
    finally:
        FastDecoder.decode_step = original
    assert measured["times"]["fp32"] > 0 and measured["spread"] >= 1.0
    assert set(steps) == {3} and len(steps) == precision.PROBE_STEPS * (1 + 5)  # a warm-up and five rounds
    times = precision.decode_times((32, 64), 2)
    assert list(times) == precision.cpu_precisions() and all(t > 0 for t in times.values())
    precision.decode_times((32, 64), 2)
    err = capsys.readouterr().err
    assert err.count("timing the decoding precisions of a 32x64 model on 2-row steps") == 1

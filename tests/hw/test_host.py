"""Hosts we do not have: kernels that fail as they do on real CPUs, and whole commands run there.

`NMT_HOST_WITHOUT` simulates a host without some kernels (child processes inherit it), and
`failing_bf16_packing` makes oneDNN's bf16 packing raise exactly as it does on an AVX2-only CPU,
so that these tests prove the fallbacks on any machine, AVX-512 included.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from nmt.errors import NmtError
from nmt.hw import host

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = ["我们九点见。", "猫在桌子上。", "他明天去北京。"]
AVX2_MESSAGE = (
    "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
)
SIMULATED = ["avx2-only", "no-avx2", "aarch64"]


@pytest.fixture(autouse=True)
def fresh_host(tmp_path, monkeypatch):
    """Every test detects the host anew and measures into its own probe cache."""
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(host.ENV, raising=False)
    host.forget()
    yield
    host.forget()


@pytest.fixture
def failing_bf16_packing(monkeypatch):
    """oneDNN's weight packing raising for bf16 as it does on an AVX2 CPU (AMD EPYC Zen 3)."""
    real = torch.ops.mkldnn._reorder_linear_weight

    def reorder(weight, *args):
        if weight.dtype == torch.bfloat16:
            raise RuntimeError(AVX2_MESSAGE)
        return real(weight, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", reorder)
    host.forget()


@pytest.mark.int8
def test_an_int8_matmul_that_runs_but_saturates_is_missing_with_the_reason(monkeypatch):
    """oneDNN without VNNI (ONEDNN_MAX_CPU_ISA=AVX2 on this CPU kind) runs torch._int_mm through
    int16 pairs that saturate: it must count as missing, not as a fast int8 kernel."""
    real = torch._int_mm

    def saturating(a, b):
        return real(a, b).clamp(-(2**15), 2**15 - 1)

    monkeypatch.setattr(torch, "_int_mm", saturating)
    host.forget()
    assert not host.current().has("int8-onednn")
    assert "wrong int32 products" in host.current().why_not("int8-onednn")
    monkeypatch.setattr(torch, "_int_mm", real)
    host.forget()
    assert host.current().has("int8-onednn") == (host._try(host._int_mm) == "")


def simulate(monkeypatch, preset: str) -> host.Host:
    monkeypatch.setenv(host.ENV, preset)
    host.forget()
    return host.current()


# --------------------------------------------------------------------------- detection


def test_a_kernel_that_raises_is_missing_with_its_reason(failing_bf16_packing):
    here = host.current()
    assert not here.has("pack-bf16") and here.why_not("pack-bf16") == AVX2_MESSAGE
    assert "pack-bf16" not in here.fingerprint


def test_presets_and_names_disable_kernels_and_unknown_ones_are_refused(monkeypatch):
    assert not simulate(monkeypatch, "aarch64").has("pack-fp32")
    assert not host.current().has("int8-fbgemm") and host.current().has("int8-qnnpack") == host._detect("").has(
        "int8-qnnpack"
    )
    here = simulate(monkeypatch, "int8-onednn, avx2-only")
    assert not here.has("int8-onednn") and not here.has("pack-bf16")
    assert "disabled by NMT_HOST_WITHOUT" in here.why_not("pack-bf16")
    with pytest.raises(ValueError, match="unknown kernel or preset 'avx9'"):
        simulate(monkeypatch, "avx9")
    with pytest.raises(KeyError):
        host.current  # noqa: B018 — the name exists; asking for an unknown kernel does not
        host._detect("").has("avx9")


def test_measurements_are_not_shared_between_hosts_with_different_kernels(monkeypatch):
    calls: list[str] = []
    for preset in ("", "bare", ""):
        simulate(monkeypatch, preset)
        host.probe("test-probe", lambda p=preset: calls.append(p) or p)
    assert calls == ["", "bare"]  # the third came from the cache of the first host


# --------------------------------------------------------------------------- choosing a precision


@pytest.mark.parametrize("preset", SIMULATED)
def test_auto_is_fp32_and_int8_runs_on_a_kernel_the_host_has(monkeypatch, preset):
    from nmt.decode.precision import cpu_precisions, fastest_int8_kernel, resolve_inference_precision

    here = simulate(monkeypatch, preset)
    assert resolve_inference_precision(torch.device("cpu"), "auto", (32, 64)) == "fp32" in cpu_precisions()
    if "int8" in cpu_precisions():
        assert here.has(fastest_int8_kernel((32, 64)))


def test_bf16_survives_the_real_avx2_failure(failing_bf16_packing):
    from nmt.decode.precision import resolve_inference_precision
    from nmt.model.convert import PackedLinear, inference_model

    assert resolve_inference_precision(torch.device("cpu"), "bf16", (32, 64)) == "bf16"  # runs, unpacked
    model = inference_model(torch.nn.Sequential(torch.nn.Linear(8, 4)), torch.device("cpu"), "bf16")
    assert not isinstance(model[0], PackedLinear)  # bf16 runs unpacked where packing fails
    assert model(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_a_precision_that_cannot_run_is_one_line_naming_why(monkeypatch):
    from nmt.decode.precision import resolve_inference_precision

    simulate(monkeypatch, "matmul-bf16,int8-fbgemm,int8-qnnpack,int8-onednn,int8-weight")
    for precision in ("bf16", "int8"):
        with pytest.raises(NmtError, match=f"--precision {precision}: this CPU .* cannot run it") as err:
            resolve_inference_precision(torch.device("cpu"), precision)
        assert "\n" not in str(err.value) and str(err.value).endswith("use fp32")
    assert resolve_inference_precision(torch.device("cpu"), "auto", (32, 64)) == "fp32"


def test_training_in_bf16_where_no_bf16_matmul_runs_is_refused(monkeypatch):
    from nmt.hw.device import check_precision

    simulate(monkeypatch, "matmul-bf16")
    with pytest.raises(NmtError, match="train.precision: bf16 does not run on this CPU"):
        check_precision(torch.device("cpu"), "bf16")
    check_precision(torch.device("cpu"), "auto")  # resolves to fp32 there


# --------------------------------------------------------------------------- whole commands


@pytest.fixture(scope="module")
def reference(tiny_run) -> list[str]:
    """fp32 translations on the real host: what every simulated host's fp32 must give."""
    from nmt.decode.translator import Translator

    host.forget()
    return Translator.from_run(tiny_run, device="cpu", precision="fp32").translate(LINES, beam=3)


@pytest.mark.parametrize("preset", SIMULATED)
@pytest.mark.slow
def test_translate_on_simulated_hosts(tiny_run, reference, monkeypatch, preset, failing_bf16_packing):
    from nmt.decode.translator import Translator

    simulate(monkeypatch, preset)
    fp32 = Translator.from_run(tiny_run, device="cpu", precision="fp32")
    assert fp32.translate(LINES, beam=3) == reference  # packed or not: the same translations
    auto = Translator.from_run(tiny_run, device="cpu", precision="auto")
    assert auto.precision == "fp32" and auto.translate(LINES, beam=3) == reference  # auto: the reference
    int8 = Translator.from_run(tiny_run, device="cpu", precision="int8")
    assert int8.translate(LINES, beam=3) == [int8.translate([line], beam=3)[0] for line in LINES]


@pytest.mark.parametrize("preset", [*SIMULATED, "int8-weight", "int8-fbgemm,int8-qnnpack,int8-onednn"])
@pytest.mark.slow
def test_one_sentence_at_a_time_on_simulated_hosts(tiny_run, reference, monkeypatch, preset, failing_bf16_packing):
    """Tuned for one sentence at a time (one-row steps: matrix-vector products where layers are
    packed, FastDecoder, the weight-only int8 kernel where the host has it) on hosts without some
    kernels — without the weight-only one, or with it as the only int8 kernel: the fp32
    translations are the batch's, int8 runs on a kernel the host has, no traceback."""
    from nmt.decode.options import ALONE_ROWS
    from nmt.decode.translator import Translator

    here = simulate(monkeypatch, preset)
    fp32 = Translator.from_run(tiny_run, device="cpu", precision="fp32", rows=ALONE_ROWS)
    assert [fp32.translate([line], beam=1)[0] for line in LINES] == fp32.translate(LINES, beam=1)
    assert fp32.translate(LINES, beam=3) == reference
    int8 = Translator.from_run(tiny_run, device="cpu", precision="int8", rows=ALONE_ROWS)
    kernels = {m.kernel for m in int8.model.modules() if hasattr(m, "kernel")}
    assert len(kernels) == 1 and here.has(kernels.pop())
    out = [int8.translate([line], beam=3)[0] for line in LINES]
    assert out == int8.translate(LINES, beam=3) and all(out)


@pytest.mark.slow
@pytest.mark.parametrize("preset", [*SIMULATED, "matmul-bf16"])
def test_training_on_simulated_hosts_logs_mfu_and_settles_every_update(
    mini_mirror, tmp_path, monkeypatch, preset, failing_bf16_packing
):
    """A short `train.precision: auto` run where kernels are missing: the matmul peak behind the
    MFU is measured in what the host runs, the device-side update bookkeeping settles, no traceback."""
    from conftest import ROOT, TINY_LEARNS, pipeline_on_one_thread

    from nmt.config import load_config

    simulate(monkeypatch, preset)
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))  # probes measured on this host
    config = load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, "train.max_steps=8", "train.log_every=4"])
    pipeline_on_one_thread(config, tmp_path / "run", mini_mirror)
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    assert "step 8 |" in log and "| mfu " in log and "Traceback" not in log


@pytest.mark.parametrize("preset", SIMULATED)
@pytest.mark.slow
def test_cli_translate_and_eval_on_simulated_hosts(tiny_run, monkeypatch, preset, failing_bf16_packing):
    from nmt.cli import app

    simulate(monkeypatch, preset)
    runner = CliRunner()
    result = runner.invoke(app, ["translate", "--run", str(tiny_run), "--engine", "native", *LINES])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 3
    result = runner.invoke(app, ["eval", "--run", str(tiny_run), "--split", "valid"])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_cli_refuses_a_precision_the_host_cannot_run_in_one_line(tiny_run, monkeypatch):
    from nmt.cli import app

    simulate(monkeypatch, "matmul-bf16")
    result = CliRunner().invoke(
        app, ["translate", "--run", str(tiny_run), "--engine", "native", "--precision", "bf16", "你好"]
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --precision bf16: this CPU") and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_pipeline_stages_after_training_on_a_failing_host(tiny_run, mini_mirror, tmp_path, failing_bf16_packing):
    """select and eval again (their stamps removed) where bf16 packing raises: the pipeline finishes."""
    from nmt.config import load_config
    from nmt.pipeline import run_pipeline

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    for stale in ("select.stamp.json", "eval.stamp.json", "checkpoints/final.safetensors"):
        (run / stale).unlink(missing_ok=True)
    result = run_pipeline(load_config(run / "config.yaml"), run, mirror=str(mini_mirror))
    assert result["stages"]["train"] == "skipped" and result["stages"]["select"] == "ran"
    assert result["eval"]["bleu"] >= 0


@pytest.mark.slow
def test_a_failing_stage_after_training_keeps_the_run_and_names_the_command(
    tiny_run, mini_mirror, tmp_path, monkeypatch
):  # noqa: E501
    import nmt.pipeline as pipeline
    from nmt.config import load_config

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "select.stamp.json").unlink()
    before = sorted(p.name for p in (run / "checkpoints").iterdir())

    def broken(*args):
        raise RuntimeError("a kernel this host lacks\nsecond line")

    monkeypatch.setattr(pipeline, "select_stage", broken)
    with pytest.raises(NmtError) as err:
        pipeline.run_pipeline(load_config(run / "config.yaml"), run, mirror=str(mini_mirror))
    message = str(err.value)
    assert "\n" not in message and "pipeline stage 'select' failed: a kernel this host lacks" in message
    assert f"nmt pipeline --run {run}" in message
    assert "RuntimeError" in (run / "pipeline-error.log").read_text()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # the trained run is untouched


@pytest.mark.slow
def test_serve_on_a_simulated_host_without_packing(tiny_run, monkeypatch):
    from serving import request, start_server, stop

    monkeypatch.setenv(host.ENV, "aarch64")
    proc, port = start_server(tiny_run, "--precision", "auto", "--workers", "1")
    try:
        status, body = request(port, "POST", "/translate", {"text": LINES})
        assert status == 200 and len(body["translations"]) == 3
    finally:
        stop(proc)

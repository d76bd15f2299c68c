from __future__ import annotations

import copy
import math

import pytest
import torch

from nmt.errors import NmtError
from nmt.hw.device import autocast, grad_scaler, resolve_device, set_threads

pytestmark = pytest.mark.precision


def test_resolve_auto_and_explicit():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["tpu", "banana", "cuda:99"])
def test_resolve_rejects_unusable_devices(name):
    with pytest.raises(NmtError, match="train.device"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(NmtError, match="CUDA is not available"):
        resolve_device("cuda")


def test_autocast_bf16_on_cpu_and_fp32_noop():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    cpu = torch.device("cpu")
    with autocast(cpu, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32


def test_fp16_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(NmtError, match="fp16"), autocast(torch.device("cpu"), "fp16"):
        pass
    with pytest.raises(NmtError, match="fp16"):
        grad_scaler(torch.device("cpu"), "fp16")


def test_grad_scaler_disabled_outside_fp16():
    for precision in ("fp32", "bf16"):
        scaler = grad_scaler(torch.device("cpu"), precision)
        assert not scaler.is_enabled()
        loss = torch.tensor(2.0, requires_grad=True)
        assert scaler.scale(loss) is loss


@pytest.mark.cuda
def test_fp16_scaler_enabled_on_cuda():
    scaler = grad_scaler(torch.device("cuda"), "fp16")
    assert scaler.is_enabled()
    with autocast(torch.device("cuda"), "fp16"):
        x = torch.randn(4, 4, device="cuda")
        assert (x @ x).dtype == torch.float16


def test_set_threads():
    before = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        set_threads(0)
        assert torch.get_num_threads() >= 1
        with pytest.raises(NmtError):
            set_threads(-1)
    finally:
        torch.set_num_threads(before)


def test_auto_precision_resolves_to_a_concrete_one():
    from nmt.hw.device import fast_bf16_available, resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision(cpu, "auto") == ("bf16" if fast_bf16_available(cpu) else "fp32")
    for p in ("fp32", "bf16"):
        assert resolve_precision(cpu, p) == p
    assert not grad_scaler(cpu, "auto").is_enabled()


# --------------------------------------------------------------------------- decoding precision


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    """Probes cached in a fresh directory and a fresh process cache."""
    from nmt.hw import host

    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(host, "_PROBES", {})
    return tmp_path


def test_inference_precision_checks_the_device(monkeypatch):
    import nmt.hw.device
    from nmt.hw.device import cpu_precisions, resolve_inference_precision

    monkeypatch.setattr(
        nmt.hw.device, "decode_times", lambda shape, rows: {}
    )  # the speeds are not what is checked here
    cpu = torch.device("cpu")
    for p in cpu_precisions():
        assert resolve_inference_precision(cpu, p, (32, 64)) == p
    for bad, device in (("fp8", cpu), ("fp16", cpu), ("int8", torch.device("cuda"))):
        with pytest.raises(NmtError, match="--precision"):
            resolve_inference_precision(device, bad)


def test_decode_times_are_measured_once_and_cached_on_disk(probe_dir, monkeypatch):
    import nmt.hw.device as device
    from nmt.hw import host

    calls = []

    def measure(d, f, rows):
        calls.append((d, f))
        return {"times": {"fp32": 2.0, "int8": 1.0}, "spread": 1.1}

    monkeypatch.setattr(device, "_time_precisions", measure)
    assert device.decode_times((32, 64)) == device.decode_times((32, 64)) == {"fp32": 2.0, "int8": 1.0}
    assert calls == [(32, 64)]  # cached in the process
    monkeypatch.setattr(host, "_PROBES", {})
    assert device.decode_times((32, 64)) == {"fp32": 2.0, "int8": 1.0}
    assert calls == [(32, 64)]  # and on disk, keyed by machine and shape
    assert host.current().fingerprint in (probe_dir / "probes.json").read_text()
    device.decode_times((16, 64))
    assert len(calls) == 2


def test_auto_decodes_in_fp32_whatever_the_probes_measured(probe_dir, monkeypatch):
    """`--precision auto` is the reference precision on every workload, without measuring: the
    output every command shares, even where int8 or bf16 measured faster."""
    import nmt.hw.device as device

    measured = []
    monkeypatch.setattr(device, "_time_precisions", lambda d, f, rows: measured.append(rows))
    cpu = torch.device("cpu")
    for rows in (device.ALONE_ROWS, device.BATCH_ROWS):
        assert device.resolve_inference_precision(cpu, "auto", (8, 16), rows) == device.REFERENCE == "fp32"
    assert measured == []


def test_decode_times_really_time_every_precision_this_host_runs(probe_dir, monkeypatch):
    import nmt.hw.device as device
    from nmt.hw.device import cpu_precisions, decode_times

    monkeypatch.setattr(device, "NOISY", math.inf)  # real timings on shared cores: kept however noisy
    monkeypatch.setattr(device, "MAX_SPEEDUP", math.inf)
    times = decode_times((32, 64))
    assert list(times) == cpu_precisions() and all(t > 0 for t in times.values())


def test_an_explicit_precision_far_slower_than_fp32_says_so_once(probe_dir, monkeypatch, capsys):
    import nmt.hw.device as device

    times = {"fp32": 1.0, "bf16": 30.0, "int8": 0.5}
    monkeypatch.setattr(device, "_time_precisions", lambda d, f, r: {"times": times, "spread": 1.0})
    monkeypatch.setattr(device, "cpu_precisions", lambda: ["fp32", "bf16", "int8"])
    device.warn_once.cache_clear()
    cpu = torch.device("cpu")
    assert device.resolve_inference_precision(cpu, "bf16", (8, 16)) == "bf16"
    assert device.resolve_inference_precision(cpu, "bf16", (8, 16)) == "bf16"
    assert device.resolve_inference_precision(cpu, "fp32", (8, 16)) == "fp32"
    lines = capsys.readouterr().err.splitlines()
    warnings = [line for line in lines if not line.startswith("timing the decoding precisions")]  # the probe's notice
    assert len(warnings) == 1 and "bf16 runs 30.0x slower than fp32" in warnings[0]
    assert "int8 is the fastest" in warnings[0]


INT8_LAYER_KERNELS = ["int8-fbgemm", "int8-qnnpack", "int8-onednn", "int8-weight"]


@pytest.mark.int8
@pytest.mark.parametrize("kernel", INT8_LAYER_KERNELS)
def test_int8_linear_rows_do_not_depend_on_the_batch_and_stay_close_to_fp32(kernel):
    from nmt.hw import host
    from nmt.model.convert import Int8Linear

    if not host.current().has(kernel):
        pytest.skip(f"{kernel} does not run here: {host.current().why_not(kernel)}")
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 20)
    layer, x = Int8Linear(linear, kernel), torch.randn(9, 48)
    with torch.no_grad():
        together = layer(x)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
        assert torch.equal(together, alone)  # bit for bit: each row has its own scale, int32 products are exact
        x[0] *= 1000  # one loud row in the batch changes nothing for the others
        assert torch.equal(layer(x)[1:], together[1:])
        torch.testing.assert_close(together, linear(x.clone().div_(torch.tensor([1000.0] + [1.0] * 8)[:, None])),
                                   atol=0.05, rtol=0.05)  # fmt: skip
        assert layer(x.view(3, 3, 48)).shape == (3, 3, 20)
        assert torch.equal(layer(torch.zeros(2, 48)), linear.bias.expand(2, 20))  # an all-zero row: the bias


@pytest.mark.int8
def test_weight_only_int8_quantises_with_the_scales_the_kernel_sees():
    """int8-weight hands the kernel bf16 scales; the weights are quantised with exactly those,
    so the kernel's product is the int8 weights times the scales it reads (no second rounding)."""
    from nmt.hw import host
    from nmt.model.convert import Int8Linear

    if not host.current().has("int8-weight"):
        pytest.skip(host.current().why_not("int8-weight"))
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 24)
    layer = Int8Linear(linear, "int8-weight")
    assert torch.equal(layer.scale_bf16.float(), layer.scale) and layer.weight_q.dtype == torch.int8
    assert int(layer.weight_q.abs().max()) <= 127
    x = torch.randn(5, 64)
    with torch.no_grad():
        exact = x.bfloat16().float() @ (layer.weight_q.float() * layer.scale[:, None]).t() + linear.bias
        torch.testing.assert_close(layer(x), exact, rtol=1e-2, atol=1e-2)  # the kernel's bf16 result
        torch.testing.assert_close(layer(x), linear(x), rtol=0.05, atol=0.05)


def test_one_row_of_a_packed_layer_is_a_matrix_vector_product_with_the_same_result():
    from nmt.model.convert import PackedLinear, can_pack

    if not can_pack(torch.float32):
        pytest.skip("this host has no oneDNN pre-packed fp32 linear")
    torch.manual_seed(2)
    for bias, relu in ((True, False), (False, True)):
        linear = torch.nn.Linear(32, 48, bias=bias)
        layer = PackedLinear(linear)
        layer.post_op = "relu" if relu else "none"
        x = torch.randn(4, 1, 32)
        with torch.no_grad():
            together = layer(x)  # (4, 1, 48): the packed kernel
            alone = torch.cat([layer(x[i : i + 1]) for i in range(4)])  # four one-row calls
            want = linear(x).relu() if relu else linear(x)
            torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(alone, want, rtol=1e-5, atol=1e-6)
            assert layer(x[0, 0]).shape == (48,)  # a bare vector keeps its shape


def test_probes_are_measured_per_workload_and_nested_probes_are_kept(probe_dir, monkeypatch):
    """The int8-kernel probe times each kernel on steps of the rows the caller decodes (one row: a
    sentence at a time; 64: batches), each its own measurement; a probe measured inside another
    (the int8 kernel inside the precision probe) is kept on disk too."""
    import nmt.hw.device as device
    from nmt.hw import host

    fake = {("int8-fbgemm", 1): 3.0, ("int8-weight", 1): 1.0, ("int8-fbgemm", 64): 2.0, ("int8-weight", 64): 4.0}
    seen: list[int] = []

    def time_models(models, rows):
        seen.append(rows)
        return {"times": {k: fake[k, rows] for k in models}, "spread": 1.0}

    monkeypatch.setattr(device, "int8_kernels", lambda: ["int8-fbgemm", "int8-weight"])
    monkeypatch.setattr(device, "inference_model", lambda model, dev, precision, kernel: kernel)
    monkeypatch.setattr(device, "_probe_model", lambda d, f: None)
    monkeypatch.setattr(device, "_time_models", time_models)
    assert host.probe("outer", lambda: device.fastest_int8_kernel((8, 16), 1)) == "int8-weight"
    assert device.fastest_int8_kernel((8, 16), device.BATCH_ROWS) == "int8-fbgemm"
    assert seen == [1, 64]
    stored = (probe_dir / "probes.json").read_text()
    assert "cpu-int8-kernel 8x16 rows 1 " in stored and "cpu-int8-kernel 8x16 rows 64 " in stored
    assert "outer |" in stored


@pytest.mark.int8
def test_int8_quantises_every_linear_layer_and_packing_keeps_outputs():
    from nmt.config import ModelConfig
    from nmt.model.convert import Int8Linear, PackedLinear, can_pack, inference_model
    from nmt.model.transformer import Transformer

    cfg = ModelConfig(d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0)
    src, tgt = torch.randint(4, 30, (2, 5)), torch.randint(4, 30, (2, 4))
    with torch.no_grad():
        ref = Transformer(cfg, 30, 30).eval()
        expected = ref(src, tgt)
        int8 = inference_model(copy.deepcopy(ref), torch.device("cpu"), "int8")
        assert not any(type(m) is torch.nn.Linear for m in int8.modules())
        assert isinstance(int8.logits_proj, Int8Linear)  # the tied projection too
        torch.testing.assert_close(int8(src, tgt), expected, atol=0.2, rtol=0.1)
        packed = inference_model(copy.deepcopy(ref), torch.device("cpu"), "fp32")
        if can_pack(torch.float32):
            assert not any(type(m) is torch.nn.Linear for m in packed.modules())
            assert isinstance(packed.logits_proj, PackedLinear)
        torch.testing.assert_close(packed(src, tgt), expected, atol=1e-4, rtol=1e-4)
        bf16 = inference_model(copy.deepcopy(ref), torch.device("cpu"), "bf16")
        assert isinstance(bf16.logits_proj, PackedLinear) == can_pack(torch.bfloat16)  # unpacked where it cannot
        torch.testing.assert_close(bf16(src, tgt).float(), expected, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_packing_fuses_relu_into_fc1_with_identical_outputs(activation):
    from nmt.model.convert import PackedLinear, can_pack, pack_linears
    from nmt.model.transformer import FeedForward

    if not can_pack(torch.float32):
        pytest.skip("this host has no oneDNN pre-packed fp32 linear")
    torch.manual_seed(0)
    ffn = FeedForward(32, 64, activation).eval()
    x = torch.randn(7, 1, 32)
    with torch.no_grad():
        ffn.fc2 = PackedLinear(ffn.fc2)
        plain = ffn.fc2(ffn.act(PackedLinear(ffn.fc1)(x)))  # packed, ReLU applied separately
        fused = pack_linears(ffn)
        assert (fused.fc1.post_op == "relu") == (activation == "relu")
        unfused = {"relu": torch.nn.functional.relu, "gelu": torch.nn.functional.gelu}[activation]
        assert (fused.act is unfused) == (activation == "gelu")  # ReLU left the Python path
        torch.testing.assert_close(fused(x), plain, atol=0, rtol=0)


def test_the_probe_times_real_decoding_steps_of_a_model_of_the_shape(probe_dir, capsys, monkeypatch):
    """`_time_models` encodes and decodes through the model's FastDecoder (what the engine runs), and
    a probe that measures says so in one line on stderr, once."""
    import nmt.hw.device as device
    from nmt.model.fast_decoder import FastDecoder

    monkeypatch.setattr(device, "NOISY", math.inf)  # real timings on shared cores: kept however noisy
    monkeypatch.setattr(device, "MAX_SPEEDUP", math.inf)
    model = device._probe_model(32, 64)
    assert model.cfg.d_model == 32 and model.cfg.decoder_layers == device.PROBE_LAYERS
    steps = []
    original = FastDecoder.decode_step
    FastDecoder.decode_step = lambda self, tokens, state: steps.append(tokens.numel()) or original(self, tokens, state)
    try:
        measured = device._time_models({"fp32": model}, 3)
    finally:
        FastDecoder.decode_step = original
    assert measured["times"]["fp32"] > 0 and measured["spread"] >= 1.0
    assert set(steps) == {3} and len(steps) == device.PROBE_STEPS * (1 + 5)  # a warm-up and five rounds
    times = device.decode_times((32, 64), 2)
    assert list(times) == device.cpu_precisions() and all(t > 0 for t in times.values())
    device.decode_times((32, 64), 2)
    err = capsys.readouterr().err
    assert err.count("timing the decoding precisions of a 32x64 model on 2-row steps") == 1


def test_candidates_are_timed_in_interleaved_rounds_and_a_hopeless_one_twice():
    """Every candidate once per round (a load that comes and goes slows each alike); one far slower
    than the best (`HOPELESS` times) is timed twice, not every round."""
    import time

    from nmt.hw import host

    order: list[str] = []

    def sleeper(name: str, seconds: float):
        return lambda: order.append(name) or time.sleep(seconds)

    times = host.interleaved_times({"fast": sleeper("fast", 0.001), "slow": sleeper("slow", 0.02)}, 4)
    assert order[:2] == ["fast", "slow"] and order[2:6] == ["fast", "slow"] * 2  # warm-ups, then rounds
    assert len(times["fast"]) == 4 and len(times["slow"]) == 2 and order.count("slow") == 3
    assert min(times["slow"]) > host.HOPELESS * min(times["fast"])
    assert host.spread([1.0, 1.1, 3.0]) == pytest.approx(1.1) and host.spread([2.0]) == 1.0

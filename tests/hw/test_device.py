from __future__ import annotations

import pytest
import torch

from nmt.errors import NmtError
from nmt.hw.device import (
    autocast,
    grad_scaler,
    matmul_row_bucket,
    resolve_device,
    set_threads,
    training_precision,
)

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
    with pytest.raises(NmtError, match="train.precision: fp16 needs a CUDA device"):
        training_precision(torch.device("cpu"), "fp16")


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
    from nmt.hw import host
    from nmt.hw.device import fast_bf16_available

    cpu = torch.device("cpu")
    assert training_precision(cpu, "auto") == ("bf16" if fast_bf16_available(cpu) else "fp32")
    assert training_precision(cpu, "fp32") == "fp32"
    if host.current().has("matmul-bf16"):
        assert training_precision(cpu, "bf16") == "bf16"


@pytest.mark.parametrize("fast", [True, False])
def test_auto_precision_follows_the_host_it_runs_on(monkeypatch, fast):
    """A host without fast bf16 (AVX2 only, no AVX512-BF16/AMX) trains auto in fp32, one with it in
    bf16: simulated, so both sides run on any CPU."""
    from nmt.hw import device

    monkeypatch.setattr(device, "fast_bf16_available", lambda _: fast)
    cpu = torch.device("cpu")
    resolved = training_precision(cpu, "auto")
    assert resolved == ("bf16" if fast else "fp32")
    assert grad_scaler(cpu, resolved).is_enabled() is False  # the scaler is for fp16 on CUDA only


def test_what_takes_a_precision_takes_it_resolved():
    """autocast and the grad scaler never resolve auto themselves: it is resolved once, at set-up."""
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="not a resolved training precision"), autocast(cpu, "auto"):
        pass
    with pytest.raises(ValueError, match="not a resolved training precision"):
        grad_scaler(cpu, "auto")
    assert not grad_scaler(cpu, training_precision(cpu, "auto")).is_enabled()


# --------------------------------------------------------------------------- decoding precision


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


def test_the_kernel_cache_is_bounded_unless_the_user_set_it(monkeypatch):
    import os

    from nmt.hw.device import KERNEL_CACHE, bound_kernel_cache

    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "x")  # recorded, so the test leaves os.environ as it was
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == KERNEL_CACHE
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


@pytest.mark.parametrize("command", ["train", "pipeline"])
def test_the_training_commands_bound_it_before_anything_runs(command, monkeypatch, tmp_path):
    """The cap is set first thing: before the run is set up (a bad config still leaves it set)."""
    import os

    from typer.testing import CliRunner

    from nmt.cli import app

    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "x")  # recorded, so the test leaves os.environ as it was
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    result = CliRunner().invoke(app, [command, "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code != 0  # the missing config stops it, after the cap was set
    assert os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == "128"


def test_matmul_row_bucket_only_for_bf16_on_a_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert matmul_row_bucket(cpu, "bf16", 2048) == 256  # max_tokens / 8
    assert matmul_row_bucket(cpu, "bf16", 5000) == 640  # rounded up to a multiple of 64
    assert matmul_row_bucket(cpu, "bf16", 100) == 64
    assert matmul_row_bucket(cpu, "fp32", 2048) == 0 and matmul_row_bucket(cuda, "bf16", 2048) == 0

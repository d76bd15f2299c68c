"""The decoding conversions of nmt/model/convert.py: int8 layers on each kernel, packed layers, and
the whole model converted."""

from __future__ import annotations

import copy

import pytest
import torch

pytestmark = pytest.mark.precision

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

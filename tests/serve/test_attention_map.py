"""Cross-attention maps recomputed from hooked module inputs: shapes, normalisation, padding, fidelity."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nmt.errors import NmtError
from nmt.model.transformer import build_model
from nmt.serve.attention_map import attention_map, attention_probs, cross_attention, cross_attention_modules

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from conftest import ROOT

    from nmt.config import load_config

    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.decoder_layers=2", "model.heads=4"])
    torch.manual_seed(1)
    return build_model(config, 50, 40).eval()


SRC = [[5, 6, 7, 8, 9], [10, 11]]  # the second is padded to the first's length
TGT = [[4, 5, 6], [7, 8, 9, 10, 11, 12]]


def test_shape_rows_sum_to_one_and_padding_gets_no_attention(model):
    probs = cross_attention(model, SRC, TGT)
    assert probs.shape == (2, 2, 4, 7, 6)  # (L, B, H, T = 6 + EOS, S = 5 + EOS)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 2, 4, 7), atol=1e-5)
    assert torch.all(probs[:, 1, :, :, 3:] == 0)  # sentence 2 has 2 pieces + EOS
    assert torch.all(probs[:, 1, :, :, :3] > 0)


@torch.inference_mode()
def test_recomputed_probabilities_reproduce_the_modules_output(model):
    """probs @ V through the output projection is exactly what each cross-attention module returned."""
    modules = cross_attention_modules(model)
    outputs = []
    handles = [m.register_forward_hook(lambda mod, args, out: outputs.append((args, out))) for m in modules]
    try:
        probs = cross_attention(model, SRC, TGT)
    finally:
        for h in handles:
            h.remove()
    for layer, (module, ((x, memory, *_), out)) in enumerate(zip(modules, outputs, strict=True)):
        D, H = memory.size(-1), module.heads
        v = nn.functional.linear(memory, module.in_proj.weight[2 * D :], module.in_proj.bias[2 * D :])
        v = v.view(*v.shape[:2], H, D // H).transpose(1, 2)  # (B, H, S, dk)
        mixed = (probs[layer] @ v).transpose(1, 2).reshape(*x.shape[:2], D)
        real = torch.tensor([[t <= len(TGT[b]) for t in range(x.size(1))] for b in range(2)])  # (B, T)
        assert torch.allclose(module.out_proj(mixed)[real], out[real], atol=1e-5)


def test_a_sentence_gets_the_same_map_alone_and_in_a_batch(model):
    alone = cross_attention(model, SRC[1:], TGT[1:])[:, 0]
    batched = cross_attention(model, SRC, TGT)[:, 1, :, :, :3]
    assert torch.allclose(alone, batched, atol=1e-5)


def test_attention_probs_masks_padding_with_random_inputs(model):
    module = cross_attention_modules(model)[0]
    x, memory = torch.randn(3, 4, 32), torch.randn(3, 5, 32)
    pad = torch.tensor([[False] * 5, [False, False, True, True, True], [False] * 4 + [True]])
    probs = attention_probs(module, x, memory, pad)
    assert probs.shape == (3, module.heads, 4, 5)
    assert torch.all(probs.masked_select(pad[:, None, None, :].expand_as(probs)) == 0)
    assert torch.allclose(probs.sum(-1), torch.ones(3, module.heads, 4))


def test_a_model_without_cross_attention_is_a_clear_error():
    with pytest.raises(NmtError, match="no decoder cross-attention module found"):
        cross_attention_modules(nn.Sequential(nn.Linear(2, 2)))


def test_a_layer_the_decoder_does_not_have_is_a_clear_error(model):
    """An NmtError, which the server answers 422 (nmt/serve/failures.py), not an IndexError (a 500)."""
    pieces = SimpleNamespace(encode=lambda text: [4, 5, 6], piece=str)
    translator = SimpleNamespace(model=model, encode_sources=lambda texts: [[5, 6, 7]], src_tok=pieces, tgt_tok=pieces)
    for layer in (None, 0, 1, -1, -2):
        assert len(attention_map(translator, "x", "y", layer).weights) == 4  # 3 pieces + EOS
    for layer in (2, 7, -3):
        with pytest.raises(NmtError, match=rf"^layer: {layer} is out of range \(-2\.\.1, the decoder's layers\)$"):
            attention_map(translator, "x", "y", layer)


@pytest.mark.slow
def test_attention_map_of_a_trained_run(tiny_run):
    from nmt.decode.options import InferenceOptions
    from nmt.decode.translator import Translator

    translator = Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="fp32"))
    source = "他们买了七只红色的猫。"
    target = translator.translate([source])[0]
    amap = attention_map(translator, source, target)
    assert amap.source[-1] == "</s>" and amap.target[-1] == "</s>"
    assert len(amap.source) == len(translator.encode_sources([source])[0]) + 1
    assert len(amap.target) == len(translator.tgt_tok.encode(target)) + 1
    assert len(amap.weights) == len(amap.target) and all(len(r) == len(amap.source) for r in amap.weights)
    assert all(abs(sum(row) - 1) < 1e-3 for row in amap.weights)
    last = attention_map(translator, source, target, layer=-1)
    assert len(last.weights) == len(amap.weights)
    with pytest.raises(NmtError, match="empty"):
        attention_map(translator, "   ", "x")
    bf16 = Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="bf16"))  # bf16 weights, packed
    half = attention_map(bf16, source, target)
    assert (half.source, half.target) == (amap.source, amap.target)
    assert torch.allclose(torch.tensor(half.weights), torch.tensor(amap.weights), atol=0.05)


@pytest.mark.slow
def test_a_ctranslate2_translator_shows_the_map_of_its_checkpoint(tiny_run):
    """CTranslate2 holds no PyTorch model: the map is read from the checkpoint it decodes, loaded once."""
    pytest.importorskip("ctranslate2")
    from nmt.decode.options import InferenceOptions
    from nmt.decode.translator import Translator
    from nmt.serve.attention_map import reading_model

    native = Translator.from_options(InferenceOptions(run_dir=tiny_run, engine="native", precision="fp32"))
    ct2 = Translator.from_options(InferenceOptions(run_dir=tiny_run, engine="ctranslate2", precision="fp32"))
    assert ct2.model is None and ct2.checkpoint == native.checkpoint
    source = "他们买了七只红色的猫。"
    target = ct2.translate([source])[0]
    theirs, ours = attention_map(ct2, source, target), attention_map(native, source, target)
    assert (theirs.source, theirs.target) == (ours.source, ours.target)
    assert torch.allclose(torch.tensor(theirs.weights), torch.tensor(ours.weights), atol=1e-4)
    assert reading_model(ct2) is reading_model(ct2)  # loaded once
    ct2 = Translator.from_options(InferenceOptions(run_dir=tiny_run, engine="ctranslate2", precision="fp32"))
    ct2.checkpoint = None  # as one built from an export directory alone
    with pytest.raises(NmtError, match="attention maps need the model's checkpoint"):
        reading_model(ct2)


@pytest.mark.slow
def test_a_placeholder_column_is_labelled_with_the_span_it_stands_for(tiny_run):
    """The page's fonts cannot draw ⦅0⦆: its column shows the pass-through span instead."""
    from nmt.data.passthrough import PLACEHOLDERS
    from nmt.decode.options import InferenceOptions
    from nmt.decode.translator import Translator

    translator = Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="fp32"))
    if translator.masker is None:
        pytest.skip("the tiny run was trained without pass-through placeholders")
    source = "他在2024年买了iPhone。"
    amap = attention_map(translator, source, "He bought an iPhone in 2024.")
    pieces = [translator.src_tok.piece(i) for i in translator.encode_sources([source])[0]]
    assert any(p in piece for piece in pieces for p in PLACEHOLDERS)  # the model saw placeholders
    assert not any(p in label for label in amap.source for p in PLACEHOLDERS)
    assert any("2024" in label for label in amap.source) and any("iPhone" in label for label in amap.source)


@pytest.mark.int8
def test_maps_of_an_int8_model_match_the_float_model(model):
    """int8 swaps nn.Linear for `Int8Linear` (no float weight to read): maps go through the layers."""
    import copy

    from nmt.model.convert import Int8Linear, quantize_int8

    quantised = quantize_int8(copy.deepcopy(model))  # splits the projections first, as decoding does
    assert isinstance(cross_attention_modules(quantised)[0].q_proj, Int8Linear)
    float_map, int8_map = cross_attention(model, SRC, TGT), cross_attention(quantised, SRC, TGT)
    assert int8_map.shape == float_map.shape
    assert torch.allclose(int8_map.sum(-1), torch.ones_like(int8_map.sum(-1)), atol=1e-5)
    assert (int8_map - float_map).abs().max() < 0.05

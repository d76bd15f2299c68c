"""The three dropouts of the Transformer, each under its own key: `model.dropout` (residual
branches and embeddings), `model.attention_dropout` (attention weights) and
`model.activation_dropout` (the FFN's inner activations). Each changes training-mode outputs
on its own; eval mode is deterministic and the same as without it."""

from __future__ import annotations

import pytest
import torch

from nmt import PAD_ID
from nmt.config import ModelConfig
from nmt.model.attention import MultiHeadAttention
from nmt.model.dropout import Dropout, as_ones, dropout, keep_mask
from nmt.model.transformer import FeedForward, Transformer

V = 30


def model(**dropouts: float) -> Transformer:
    cfg = ModelConfig(d_model=32, heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, max_positions=64,
                      dropout=0.0, attention="math", **dropouts)  # fmt: skip
    torch.manual_seed(0)
    return Transformer(cfg, V, V)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, V, (3, 7), generator=g), torch.randint(4, V, (3, 6), generator=g)
    src[1, 5:] = PAD_ID
    return src, tgt


@pytest.mark.parametrize("key", ["attention_dropout", "activation_dropout"])
def test_each_dropout_reaches_its_modules_and_only_acts_in_training(key):
    m = model(**{key: 0.3})
    plain = model()  # the same weights (same seed), no dropout at all
    plain.load_state_dict(m.state_dict())
    kinds = {"attention_dropout": MultiHeadAttention, "activation_dropout": FeedForward}
    owners = [mod for mod in m.modules() if isinstance(mod, kinds[key])]
    got = [mod.dropout if key == "attention_dropout" else mod.activation_dropout for mod in owners]
    assert owners and got == [0.3] * len(owners)
    src, tgt = inputs()
    m.train(), plain.train()
    torch.manual_seed(5)
    a = m(src, tgt)
    b = m(src, tgt)
    reference = plain(src, tgt)  # no dropout anywhere: training mode is deterministic
    assert not torch.allclose(a, b) and not torch.allclose(a, reference)
    m.eval(), plain.eval()
    with torch.no_grad():
        e1, e2 = m(src, tgt), m(src, tgt)
        assert torch.equal(e1, e2) and torch.allclose(e1, plain(src, tgt), atol=1e-6)


def test_activation_dropout_drops_the_inner_activations_at_its_rate():
    ffn = FeedForward(16, 4000, "relu", activation_dropout=0.25).train()
    seen: list[torch.Tensor] = []
    ffn.fc2.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    with torch.no_grad():
        torch.nn.init.ones_(ffn.fc1.weight), torch.nn.init.zeros_(ffn.fc1.bias)  # every activation positive
        ffn(torch.ones(8, 16))
    dropped = (seen[0] == 0).float().mean().item()
    assert dropped == pytest.approx(0.25, abs=0.01)
    assert seen[0].max().item() == pytest.approx(16 / 0.75)  # survivors scaled by 1 / (1 - p)


# --------------------------------------------------------------------------- the CPU masks (nmt.model.dropout)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_masks_drop_at_the_rate_asked(p):
    torch.manual_seed(0)
    n = 1_000_000
    kept = keep_mask((n,), p).sum().item()
    rate = 1 - round(p * 65536) / 65536  # p to 2^-16
    assert abs(kept - n * rate) < 6 * (n * rate * (1 - rate)) ** 0.5  # six binomial standard deviations


def test_cpu_masks_follow_the_seed_and_any_shape():
    torch.manual_seed(3)
    a = keep_mask((3, 5, 7), 0.2)  # 105 elements: not a whole number of 64-bit draws
    torch.manual_seed(3)
    b = keep_mask((3, 5, 7), 0.2)
    c = keep_mask((3, 5, 7), 0.2)
    assert a.shape == (3, 5, 7) and a.dtype == torch.bool
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dropout_scales_the_kept_and_the_gradient_follows_the_same_mask():
    x = (torch.rand(64, 33) + 0.5).requires_grad_()  # no zeros: a zero output means dropped
    torch.manual_seed(1)
    y = dropout(x, 0.25)
    kept = y != 0
    assert 0 < kept.sum() < x.numel()
    assert torch.allclose(y[kept], x[kept] / 0.75)
    (y * 2).sum().backward()
    assert torch.allclose(x.grad, kept.float() * 2 / 0.75)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_as_ones_give_the_products_of_the_bool_masks(dtype):
    torch.manual_seed(2)
    keep = keep_mask((40, 24), 0.3)[:, ::2]  # a strided view, as a mask may come
    ones = as_ones(keep, dtype)
    assert ones.dtype == dtype and torch.equal(ones, keep.to(dtype))
    x = torch.randn(40, 12, dtype=dtype, requires_grad=True)
    torch.manual_seed(4)
    y = dropout(x, 0.3)
    torch.manual_seed(4)
    mask = keep_mask(x.shape, 0.3)
    assert torch.equal(y, x.detach().mul(mask).mul_(1 / 0.7))  # bit for bit the bool product
    y.backward(torch.full_like(y, 3.0))
    assert torch.equal(x.grad, torch.full_like(x, 3.0).mul(mask).mul_(1 / 0.7))


def test_dropout_is_the_identity_outside_training_and_at_zero():
    x = torch.randn(4, 8)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    module = Dropout(0.3).eval()
    assert module(x) is x
    assert not torch.equal(module.train()(x), x)


def test_other_devices_and_rates_take_torchs_dropout(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the CPU masks were used")

    monkeypatch.setattr("nmt.model.dropout.keep_mask", refuse)
    assert dropout(torch.empty(4, 8, device="meta"), 0.3).device.type == "meta"  # stands for CUDA
    assert torch.equal(dropout(torch.ones(4, 8), 1.0), torch.zeros(4, 8))
    with pytest.raises(AssertionError, match="CPU masks"):
        dropout(torch.ones(4, 8), 0.3)


def test_the_transformer_uses_the_cpu_masks(monkeypatch):
    calls = []
    real = keep_mask

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr("nmt.model.dropout.keep_mask", counted)
    cfg = ModelConfig(d_model=32, heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, max_positions=64,
                      dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, attention="math")  # fmt: skip
    Transformer(cfg, V, V).train()(*inputs())
    # residual branches (2 per encoder layer, 3 per decoder layer), 2 embeddings, 3 attentions, 2 FFNs
    assert len(calls) == 2 + 3 + 2 + 3 + 2

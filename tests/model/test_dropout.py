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

"""The regularisers of a training update (`nmt.train.regularisers`, `Trainer._loss`): source word
dropout, label smoothing at the configured value, R-Drop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from toy_runs import Steps, toy_config, toy_run

from nmt import EOS_ID, PAD_ID, UNK_ID
from nmt.config import TrainConfig
from nmt.model.transformer import Transformer
from nmt.train.loop import fit
from nmt.train.regularisers import drop_source_words, symmetric_kl
from nmt.train.update import Trainer

V = 40


class Lookup(nn.Module):
    """logits (B, T, V) = an embedding of tgt_in + the mean embedding of src, dropout `p` on them;
    remembers every src it was given."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.src_emb, self.p, self.seen = nn.Embedding(V, V), nn.Embedding(V, V), p, []
        with torch.no_grad():
            self.emb.weight.mul_(4.0)  # confident predictions: the smoothing rate shows in the loss

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        self.seen.append(src.clone())
        out = self.emb(tgt_in) + self.src_emb(src).mean(1, keepdim=True)
        out = F.dropout(out, self.p, training=self.training)
        self.outs = getattr(self, "outs", []) + [out.detach()]
        return out


def batch(b: int = 64, s: int = 50, t: int = 9, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (b, s) with EOS then padding from a random length on; tgt_in, tgt_out (b, t)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    for i, n in enumerate(torch.randint(2, s, (b,), generator=g).tolist()):
        src[i, n], src[i, n + 1 :] = EOS_ID, PAD_ID
    tgt_out = torch.randint(4, V, (b, t), generator=g)
    tgt_out[1, 5:] = PAD_ID
    tgt_in = torch.cat([torch.full((b, 1), 2), tgt_out[:, :-1]], 1)
    return src, tgt_in, tgt_out


def trainer(model: nn.Module, **train: float) -> Trainer:
    cfg = TrainConfig(lr=1e-2, warmup=0, precision="fp32", max_steps=10, **train)
    return Trainer(model, cfg, torch.device("cpu"), precision="fp32")


# --------------------------------------------------------------------------- source word dropout


def test_source_word_dropout_replaces_pieces_at_its_rate_and_spares_pad_and_eos():
    src, tgt_in, tgt_out = batch()
    before = src.clone()
    model = Lookup()
    torch.manual_seed(11)
    trainer(model, src_word_dropout=0.3).update([(src, tgt_in, tgt_out)])
    seen = model.seen[0]
    assert torch.equal(src, before)  # the batch itself is not changed
    real = before >= 4
    replaced = (seen != before) & real
    assert torch.equal(seen[~real], before[~real])  # PAD and EOS where they were
    assert (seen[replaced] == UNK_ID).all()
    assert replaced.sum() / real.sum() == pytest.approx(0.3, abs=0.03)  # about 1,600 pieces


def test_without_source_word_dropout_the_source_is_unchanged():
    src, tgt_in, tgt_out = batch()
    model = Lookup()
    trainer(model).update([(src, tgt_in, tgt_out)])
    assert torch.equal(model.seen[0], src)
    assert drop_source_words(src, 0.0) is src


class Watched(Transformer):
    """The Transformer, recording whether each source it encodes holds an <unk>, by mode."""

    def encode(self, src, packing=None):
        self.unk_seen = getattr(self, "unk_seen", []) + [(self.training, bool((src == UNK_ID).any()))]
        return super().encode(src, packing)


def test_validation_and_its_decoding_see_the_source_untouched(tmp_path):
    """A real training run with src_word_dropout 0.5: training sources hold <unk>s, the sources of
    the validation loss and of its greedy decoding none (the toy data has no <unk>)."""
    models = []

    def build(config, src_vocab, tgt_vocab):
        models.append(Watched(config.model, src_vocab, tgt_vocab))
        return models[0]

    fit(toy_config("train.src_word_dropout=0.5", "train.max_steps=6"), toy_run(tmp_path / "r"), build=build)
    seen = models[0].unk_seen
    assert any(unk for training, unk in seen if training)
    assert [unk for training, unk in seen if not training] == [False] * sum(not t for t, _ in seen) != []


# --------------------------------------------------------------------------- label smoothing


@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_the_update_uses_the_configured_label_smoothing(epsilon):
    src, tgt_in, tgt_out = batch()
    model = Lookup()
    with torch.no_grad():
        logits = model(src, tgt_in)
    want = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=epsilon)
    other = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=0.2)
    t = trainer(model, label_smoothing=epsilon)
    t.update([(src, tgt_in, tgt_out)])
    got = t.sync()[0].loss
    assert got == pytest.approx(want.item(), rel=1e-5) and got != pytest.approx(other.item(), abs=1e-3)


# --------------------------------------------------------------------------- R-Drop


def test_symmetric_kl_by_hand_and_without_padding():
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    target = torch.tensor([[5, 6, PAD_ID], [5, 6, 7]])
    pa, pb = a.softmax(-1), b.softmax(-1)
    rows = 0.5 * ((pa * (pa / pb).log()).sum(-1) + (pb * (pb / pa).log()).sum(-1))  # (2, 3)
    assert symmetric_kl(a, b, target, packed=False).item() == pytest.approx(
        rows[target != PAD_ID].sum().item(), rel=1e-5
    )
    assert symmetric_kl(a, a, target, packed=False).item() == pytest.approx(0.0, abs=1e-6)
    packed = symmetric_kl(a[target != PAD_ID], b[target != PAD_ID], target[target != PAD_ID], packed=True)
    assert packed.item() == pytest.approx(rows[target != PAD_ID].sum().item(), rel=1e-5)


def weights_after(model: nn.Module, **train: float) -> list[torch.Tensor]:
    torch.manual_seed(7)
    trainer(model, **train).update([batch()])
    return [p.detach().clone() for p in model.parameters()]


def test_rdrop_runs_two_passes_and_adds_the_kl_of_their_dropout():
    """Without dropout the two passes agree: KL 0, the same update as without R-Drop. With
    dropout the KL term changes the update; the logged loss stays the mean cross-entropy."""
    twice, once = Lookup(), Lookup()
    same = zip(weights_after(twice, rdrop_alpha=5.0), weights_after(once), strict=True)
    assert all(torch.equal(a, b) for a, b in same)
    assert len(twice.seen) == 2 and len(once.seen) == 1
    noisy, (src, tgt_in, tgt_out) = Lookup(p=0.3), batch()
    objective, loss, _ = trainer(noisy, rdrop_alpha=5.0)._loss(src, tgt_in, tgt_out, None)
    kl = symmetric_kl(noisy.outs[0], noisy.outs[1], tgt_out, packed=False)
    assert kl > 0 and (objective - loss).item() == pytest.approx(5.0 * kl.item(), rel=1e-4)
    model, (src, tgt_in, tgt_out) = Lookup(p=0.3), batch()
    t = trainer(model, rdrop_alpha=5.0)
    t.update([(src, tgt_in, tgt_out)])
    loss = t.sync()[0].loss
    ce = [
        F.cross_entropy(o.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=0.1)
        for o in model.outs
    ]
    assert ce[0] != ce[1] and loss == pytest.approx((ce[0] + ce[1]).item() / 2, rel=1e-5)  # not α × KL on top


def test_rdrop_trains_the_transformer_on_its_packed_logits(tmp_path):

    steps = Steps()
    fit(toy_config("train.rdrop_alpha=1.0", "train.max_steps=4"), toy_run(tmp_path / "r"), on_step=steps)
    assert len(steps.losses) == 4 and all(0 < x < 10 for x in steps.losses)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("train.src_word_dropout=1.0", "train.src_word_dropout: 1.0 is outside"),
        ("train.rdrop_alpha=-1", "train.rdrop_alpha: must be >= 0"),
        ("train.ema_decay=1.0", "train.ema_decay: 1.0 is outside"),
        ("train.subword_alpha=2", "train.subword_alpha: 2.0 is outside"),
        ("train.concat_pairs=1.5", "train.concat_pairs: 1.5 is outside"),
        ("model.activation_dropout=-0.1", "model.activation_dropout: -0.1 is outside"),
    ],
)
def test_impossible_regulariser_settings_are_one_line_errors(setting, message):
    from nmt.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as e:
        toy_config(setting)
    assert "\n" not in str(e.value)

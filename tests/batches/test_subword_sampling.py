"""Subword sampling of the training pairs (`train.subword_alpha`, `nmt.batches.subword_sampling`):
the text stays, the pieces change, the same for the same (seed, epoch, pair) on any thread and
after a resume, and pairs that cannot be resampled safely are kept."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
import torch

from nmt import UNK_ID
from nmt.batches.batching import TokenBatchSampler
from nmt.batches.subword_sampling import Resegmenter
from nmt.train import loop
from nmt.train.update import TrainState


def resegmenter(spm_models, alpha: float = 0.1, seed: int = 1, max_len: int = 200) -> Resegmenter:
    return Resegmenter(*spm_models, alpha=alpha, seed=seed, max_len=max_len)


def test_resampled_pairs_keep_their_text_and_change_their_pieces(spm_models, spm_encoded):
    sps = [spm.SentencePieceProcessor(model_file=str(m)) for m in spm_models]
    idx = list(range(100))
    out = resegmenter(spm_models).resegment(idx, spm_encoded[:100], epoch=0)
    for (s, t), (s2, t2) in zip(spm_encoded[:100], out, strict=True):
        assert sps[0].decode(list(map(int, s2))) == sps[0].decode(s.tolist())
        assert sps[1].decode(list(map(int, t2))) == sps[1].decode(t.tolist())

    def changed(resampled) -> float:
        en = zip(spm_encoded[:100], resampled, strict=True)
        return np.mean([list(map(int, a)) != b.tolist() for (_, b), (_, a) in en])

    near_best = resegmenter(spm_models, alpha=1.0).resegment(idx, spm_encoded[:100], epoch=0)
    assert changed(out) > 0.5 and changed(near_best) < changed(out)  # a larger alpha stays nearer the best


def test_the_segmentation_depends_on_seed_epoch_and_pair_only(spm_models, spm_encoded):
    idx, batch = [7, 8, 9, 10], spm_encoded[7:11]
    a = resegmenter(spm_models).resegment(idx, batch, epoch=3)
    resegmenter(spm_models).resegment([1, 2], spm_encoded[1:3], epoch=0)  # other draws in between change nothing
    assert resegmenter(spm_models).resegment(idx, batch, epoch=3) == a
    assert resegmenter(spm_models).resegment(idx[::-1], batch[::-1], epoch=3) == a[::-1]  # per pair, not per call
    assert resegmenter(spm_models).resegment(idx, batch, epoch=4) != a
    assert resegmenter(spm_models, seed=2).resegment(idx, batch, epoch=3) != a


def test_pairs_with_unk_or_grown_past_max_len_stay_as_stored(spm_models, spm_encoded):
    s, t = spm_encoded[0]
    with_unk = (s, np.concatenate([t, [UNK_ID]]))
    assert resegmenter(spm_models).resegment([0], [with_unk], epoch=0)[0] is with_unk
    limit = int(np.median([max(len(a), len(b)) for a, b in spm_encoded[:50]])) + 2
    out = resegmenter(spm_models, max_len=limit).resegment(range(50), spm_encoded[:50], epoch=0)
    kept = [o is e for o, e in zip(out, spm_encoded[:50], strict=True)]
    assert all(k or max(len(a), len(b)) <= limit for k, (a, b) in zip(kept, out, strict=True))
    assert 0 < sum(kept) < 50


def feed_batches(data, state: TrainState, groups: int) -> list[torch.Tensor]:
    feed = loop.BatchFeed(data, 1, state, torch.device("cpu"))
    try:
        return [feed.next(state)[0].src for _ in range(groups)] + [feed.next(state)[0].tgt_out]
    finally:
        feed.close()


def test_the_feed_resamples_the_same_on_the_prefetch_thread_and_after_a_resume(spm_models, spm_encoded, monkeypatch):
    dataset = SimpleNamespace(pair=lambda i: spm_encoded[i], __len__=None)
    lengths = [np.array([len(p[side]) for p in spm_encoded]) for side in (0, 1)]
    batches = TokenBatchSampler(*lengths, max_tokens=300, max_len=200, seed=3)
    data = SimpleNamespace(dataset=dataset, sampler=batches, subwords=resegmenter(spm_models))
    plain = SimpleNamespace(dataset=dataset, sampler=batches, subwords=None)
    straight = feed_batches(data, TrainState(), 30)  # crosses an epoch boundary
    assert len(batches) < 30
    assert any(not torch.equal(a, b) for a, b in zip(straight, feed_batches(plain, TrainState(), 30), strict=True))
    mid = TrainState()
    feed_batches(data, mid, 11)  # stops after 12 groups: the position a checkpoint would save
    resumed = feed_batches(data, TrainState(epoch=mid.epoch, batch_in_epoch=mid.batch_in_epoch), 18)
    assert all(torch.equal(a, b) for a, b in zip(resumed[:-1], straight[12:30], strict=True))
    monkeypatch.setattr(loop, "PREFETCH_DEVICES", ("cpu",))
    ahead = feed_batches(data, TrainState(), 30)
    assert all(torch.equal(a, b) for a, b in zip(ahead, straight, strict=True))


@pytest.mark.slow
def test_a_run_trains_on_resampled_pieces_and_validates_on_the_stored_ones(tiny_run, tmp_path, monkeypatch):
    """fit() on a copy of a real run's data and vocabularies with subword_alpha on: the training
    batches hold other pieces than the stored ones, the same text; validation reads the stored ones."""
    import shutil

    from conftest import ROOT, TINY_LEARNS

    from nmt.config import load_config
    from nmt.data.tokenizer import load_tokenizers
    from nmt.train.update import Trainer
    from nmt.train.validation import Validator

    run = tmp_path / "run"
    for part in ("bin", "vocab", "corpus"):
        shutil.copytree(tiny_run / part, run / part)
    config = load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, "train.max_steps=3", "train.subword_alpha=0.1"])
    trained, validated = [], []
    update, validate = Trainer.update, Validator.loss
    monkeypatch.setattr(Trainer, "update", lambda self, b, **kw: trained.extend(b) or update(self, b, **kw))
    monkeypatch.setattr(Validator, "loss", lambda self, model: validated.append(self.dataset) or validate(self, model))
    loop.fit(config, run)
    _, en = load_tokenizers(run, config)
    texts = {en.decode(ids.tolist()) for b in trained for ids in b.tgt_out}  # ids + EOS + pads: decode drops them
    info = SimpleNamespace(rank=0, world_size=1, is_main=False)
    stored = loop.TrainData.open(config, run, torch.device("cpu"), info, "fp32")
    pieces = {tuple(stored.dataset.pair(i)[1].tolist()) for i in range(len(stored.dataset))}
    assert texts <= {en.decode(list(p)) for p in pieces}  # the same sentences
    rows = [tuple(t[: int((t != 0).sum()) - 1].tolist()) for b in trained for t in b.tgt_out]
    assert sum(r not in pieces for r in rows) > len(rows) // 4  # in other pieces
    assert validated and validated[0].split == "valid" and stored.subwords is not None

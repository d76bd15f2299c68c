"""Copy examples made on the fly (`train.copy_spans`, `nmt.batches.copy_spans`): an aligned name,
number or placeholder becomes the same made-up span on both sides, raw; the same for the same
(seed, epoch, pair) on any thread and after a resume; other pairs stay as stored."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
import torch
from conftest import SPM_PAIRS
from test_subword_sampling import feed_batches

from nmt import UNK_ID
from nmt.batches.batching import TokenBatchSampler
from nmt.batches.copy_spans import SpanCopier, fill_slots, made_up_name, made_up_number
from nmt.config import PASSTHROUGH_KINDS
from nmt.data.passthrough import Detector
from nmt.errors import NmtError
from nmt.train import loop
from nmt.train.update import TrainState

DETECT = Detector(PASSTHROUGH_KINDS)


def spans(text: str) -> list[tuple[str, str]]:
    return [(s.text, s.kind) for s in DETECT.find(text)]


def test_made_up_spans_are_what_the_pass_through_score_counts():
    """Each made-up name is one `latin` span and each number one `number` span, also inside
    Chinese text, so a copy example teaches what the raw-path score checks."""
    rng = np.random.default_rng(0)
    names, numbers = [made_up_name(rng) for _ in range(300)], [made_up_number(rng) for _ in range(300)]
    assert all(spans(f"我叫{n}。") == [(n, "latin")] for n in names)
    assert all(spans(f"他有{n}本书。") == [(n, "number")] for n in numbers)
    assert len(set(names)) > 250 and len(set(numbers)) > 150  # made up, not drawn from a short list
    assert any(n.isupper() for n in names) and any(any(c.isdigit() for c in n) for n in names)


@pytest.mark.parametrize(
    ("zh", "en", "kind"),
    [
        ("我有三只猫。", "I have three cats.", "number"),
        ("三个人来了。", "Three people came.", "number"),  # capitalised at the start
        ("汤姆在哪里？", "Where is Tom?", "latin"),
        ("汤姆的狗", "Tom's dog", "latin"),
    ],
)
def test_an_aligned_word_pair_becomes_one_span_on_both_sides(zh, en, kind):
    out = fill_slots(zh, en, np.random.default_rng(3))
    assert out is not None
    (span, found), *rest = spans(out[0])
    assert not rest and found == kind and (span, kind) in spans(out[1])  # every English word is a latin token
    assert out[0].replace(span, "") == zh.replace("三", "").replace("汤姆", "")
    assert span in out[1] and "Tom" not in out[1] and "hree" not in out[1]


def test_placeholders_on_both_sides_are_filled_and_one_anchor_of_several():
    pair = ("⦅0⦆和汤姆在⦅1⦆号，玛丽不在。", "⦅0⦆ and Tom are at ⦅1⦆; Mary is not.")
    zh, en = fill_slots(*pair, np.random.default_rng(1))
    assert "⦅" not in zh + en
    assert len(spans(zh)) == 3 and {s for s, _ in spans(zh)} <= {s for s, _ in spans(en)}
    assert ("汤姆" in zh) != ("玛丽" in zh) and ("Tom" in en) != ("Mary" in en)  # one anchor replaced


@pytest.mark.parametrize(
    ("zh", "en"),
    [
        ("我喜欢猫。", "I like cats."),  # no slot
        ("汤姆和汤姆", "Tom and Tom"),  # twice: which is which is unknown
        ("我有三只猫。", "I have some cats."),  # one side only
        ("十二个", "twelve"),  # "ten" is not a word of "twelve"
        ("⦅0⦆年", "in ⦅1⦆"),  # placeholders that do not match
    ],
)
def test_a_pair_without_an_aligned_slot_is_left_alone(zh, en):
    assert fill_slots(zh, en, np.random.default_rng(0)) is None


def copier(spm_models, share: float = 1.0, seed: int = 1, max_len: int = 200, src_lang: str = "zh") -> SpanCopier:
    return SpanCopier(*spm_models, src_lang=src_lang, share=share, seed=seed, max_len=max_len)


def decoded(spm_models, pairs) -> list[tuple[str, str]]:
    sps = [spm.SentencePieceProcessor(model_file=str(m)) for m in spm_models]
    return [(sps[0].decode(list(map(int, s))), sps[1].decode(list(map(int, t)))) for s, t in pairs]


def test_the_copier_changes_the_pairs_with_a_slot_and_leaves_the_rest_as_stored(spm_models, spm_encoded):
    idx = range(200)
    out = copier(spm_models).copy(idx, spm_encoded[:200], epoch=0)
    changed = [i for i in idx if out[i] is not spm_encoded[i]]
    eligible = [i for i in idx if fill_slots(*SPM_PAIRS[i], np.random.default_rng(0)) is not None]
    assert changed == eligible and len(changed) > 20
    for i, (zh, en) in zip(changed, decoded(spm_models, [out[i] for i in changed]), strict=True):
        assert zh != SPM_PAIRS[i][0] and spans(zh)  # raw spans, copied:
        assert {s for s, _ in spans(zh)} <= {s for s, _ in spans(en)}
    none = copier(spm_models, share=0.0).copy(idx, spm_encoded[:200], epoch=0)
    assert all(a is b for a, b in zip(none, spm_encoded[:200], strict=True))
    half = copier(spm_models, share=0.5).copy(idx, spm_encoded[:200], epoch=0)
    assert 0.3 < sum(a is not b for a, b in zip(half, spm_encoded[:200], strict=True)) / len(changed) < 0.7


def ids(pairs) -> list[tuple[list[int], list[int]]]:
    return [(list(map(int, a)), list(map(int, b))) for a, b in pairs]


def test_the_source_side_follows_the_direction(spm_models, spm_encoded):
    """en→zh: the anchors' zh word is looked for in the target; the copies are the same."""
    reverse = SpanCopier(*spm_models[::-1], src_lang="en", share=1.0, seed=1, max_len=200)
    out = reverse.copy(range(50), [(t, s) for s, t in spm_encoded[:50]], epoch=0)
    forward = copier(spm_models).copy(range(50), spm_encoded[:50], epoch=0)
    assert ids((t, s) for s, t in out) == ids(forward) != ids(spm_encoded[:50])


def test_the_copies_depend_on_seed_epoch_and_pair_only(spm_models, spm_encoded):
    idx, batch = [7, 8, 9, 10, 11, 12], spm_encoded[7:13]
    a = copier(spm_models).copy(idx, batch, epoch=3)
    copier(spm_models).copy([1, 2], spm_encoded[1:3], epoch=0)  # other draws in between change nothing
    assert copier(spm_models).copy(idx, batch, epoch=3) == a
    assert copier(spm_models).copy(idx[::-1], batch[::-1], epoch=3) == a[::-1]  # per pair, not per call
    assert copier(spm_models).copy(idx, batch, epoch=4) != a
    assert copier(spm_models, seed=2).copy(idx, batch, epoch=3) != a


def test_pairs_grown_past_max_len_or_holding_unk_stay_as_stored(spm_models, spm_encoded):
    idx = range(100)
    eligible = [i for i in idx if fill_slots(*SPM_PAIRS[i], np.random.default_rng(0)) is not None]
    limit = max(max(len(a), len(b)) for a, b in (spm_encoded[i] for i in eligible))
    out = copier(spm_models, max_len=limit).copy(idx, spm_encoded[:100], epoch=0)
    grown = [o for o, e in zip(out, spm_encoded, strict=False) if o is not e]
    assert all(max(len(a), len(b)) <= limit for a, b in grown)
    assert any(out[i] is spm_encoded[i] for i in eligible)  # some grew past the limit
    s, t = spm_encoded[eligible[0]]
    with_unk = (s, np.concatenate([t, [UNK_ID]]))
    assert copier(spm_models).copy([0], [with_unk], epoch=0)[0] is with_unk


def test_missing_models_are_a_one_line_error(spm_models, tmp_path):
    with pytest.raises(NmtError, match=r"train.copy_spans: .*missing.model: SentencePiece model not found"):
        SpanCopier(spm_models[0], tmp_path / "missing.model", src_lang="zh", share=0.5, seed=1, max_len=100)


def test_the_feed_copies_the_same_on_the_prefetch_thread_and_after_a_resume(spm_models, spm_encoded, monkeypatch):
    dataset = SimpleNamespace(pair=lambda i: spm_encoded[i], __len__=None)
    lengths = [np.array([len(p[side]) for p in spm_encoded]) for side in (0, 1)]
    batches = TokenBatchSampler(*lengths, max_tokens=300, max_len=200, seed=3)
    data = SimpleNamespace(dataset=dataset, sampler=batches, subwords=None, copies=copier(spm_models, share=0.5))
    plain = SimpleNamespace(dataset=dataset, sampler=batches, subwords=None, copies=None)
    straight = feed_batches(data, TrainState(), 30)  # crosses an epoch boundary
    assert len(batches) < 30
    assert any(not torch.equal(a, b) for a, b in zip(straight, feed_batches(plain, TrainState(), 30), strict=True))
    mid = TrainState()
    feed_batches(data, mid, 11)
    resumed = feed_batches(data, TrainState(epoch=mid.epoch, batch_in_epoch=mid.batch_in_epoch), 18)
    assert all(torch.equal(a, b) for a, b in zip(resumed[:-1], straight[12:30], strict=True))
    monkeypatch.setattr(loop, "PREFETCH_DEVICES", ("cpu",))
    ahead = feed_batches(data, TrainState(), 30)
    assert all(torch.equal(a, b) for a, b in zip(ahead, straight, strict=True))


@pytest.mark.slow
def test_a_run_with_copy_spans_trains_on_copies(tiny_run):
    """TrainData of a real run's data and vocabularies: with train.copy_spans the training batches
    hold made-up names and numbers (digits where the stored pairs say "seven"); without, the stored
    pieces."""
    from conftest import ROOT, TINY_LEARNS

    from nmt.config import load_config
    from nmt.data.tokenizer import load_tokenizers

    info = SimpleNamespace(rank=0, world_size=1, is_main=False)

    def targets(share: float) -> list[str]:
        config = load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, f"train.copy_spans={share}"])
        data = loop.TrainData.open(config, tiny_run, torch.device("cpu"), info, "fp32")
        assert (data.copies is None) == (share == 0)
        _, en = load_tokenizers(tiny_run, config)
        feed, state = loop.BatchFeed(data, 1, TrainState(), torch.device("cpu")), TrainState()
        try:
            batches = [feed.next(state)[0] for _ in range(10)]
        finally:
            feed.close()
        return [en.decode(ids.tolist()) for b in batches for ids in b.tgt_out]

    plain, copied = targets(0.0), targets(1.0)
    changed = [(p, c) for p, c in zip(plain, copied, strict=True) if p != c]
    assert len(changed) > len(plain) // 20
    assert all(any(ch.isdigit() for ch in c) or any(ch.isupper() for ch in c[1:]) for _, c in changed)

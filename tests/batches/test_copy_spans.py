"""Copy examples (`train.copy_spans`, `nmt.batches.copy_spans`): an aligned name, number or
placeholder becomes the same made-up span on both sides, raw, in extra pairs after each window's
own; the same for the same seed; the split's own pairs stay as stored."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
import torch
from conftest import SPM_PAIRS

from nmt import UNK_ID
from nmt.batches.copy_spans import (
    CopiedPairs,
    CopySettings,
    fill_slots,
    has_byte_fallback,
    made_up_name,
    made_up_number,
    spell_spans,
    writes_accents,
)
from nmt.config import ACCENTED_LETTERS, PASSTHROUGH_KINDS
from nmt.data.passthrough import Detector
from nmt.errors import NmtError
from nmt.train import loop

DETECT = Detector(PASSTHROUGH_KINDS)


def without_byte_fallback(folder, lines: list[str], size: int, required: str = ""):
    """A unigram model of `lines` without byte fallback (as nmt's English side by default), in
    `folder`; `required`: characters made pieces whatever their frequency."""
    (folder / "en.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "en.txt"), model_prefix=str(folder / "en"), vocab_size=size,
        hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2, required_chars=required,
    )  # fmt: skip
    return folder / "en.model"


def spans(text: str) -> list[tuple[str, str]]:
    return [(s.text, s.kind) for s in DETECT.find(text)]


def test_made_up_spans_are_what_the_pass_through_score_counts():
    """Each word of a made-up name is one `latin` span and each number one `number` span, also
    inside Chinese text, so a copy example teaches what the raw-path score checks."""
    rng = np.random.default_rng(0)
    names, numbers = [made_up_name(rng) for _ in range(300)], [made_up_number(rng) for _ in range(300)]
    assert all(spans(f"我叫{n}。") == [(w, "latin") for w in n.split(" ")] for n in names)
    assert all(spans(f"他有{n}本书。") == [(n, "number")] for n in numbers)
    assert len(set(names)) > 250 and len(set(numbers)) > 150  # made up, not drawn from a short list
    assert any(n.isupper() for n in names) and any(any(c.isdigit() for c in n) for n in names)
    runs = [made_up_number(rng) for _ in range(1000)]
    assert sum("00" in n for n in runs) > 90  # years and round numbers, runs of equal digits: ~136 expected


def test_a_share_of_made_up_names_is_several_words():
    """About SEVERAL_WORDS_SHARE of the names are two or three words, one space apart (a full name:
    "Terry Tate"), the rest one word; a three-word name is the rarer."""
    rng = np.random.default_rng(0)
    words = [len(made_up_name(rng).split(" ")) for _ in range(2000)]
    assert set(words) == {1, 2, 3}
    assert 0.15 < sum(w > 1 for w in words) / len(words) < 0.25  # SEVERAL_WORDS_SHARE = 0.2
    assert words.count(2) > 2 * words.count(3)


def test_a_name_of_several_words_is_spelled_with_its_spaces(spm_models):
    """The target spells a two-word name letter by letter with its space as the piece "▁" (the
    word boundary a copy must write), and decodes to the same text."""
    target = spm.SentencePieceProcessor(model_file=str(spm_models[1]))
    text = "Where is Kovemi Brandel now?"
    ids = spell_spans(target, text, ["Kovemi Brandel"])
    assert target.decode(ids) == text
    spelled = [chr(int(target.id_to_piece(i)[3:5], 16)) if target.is_byte(i) else target.id_to_piece(i) for i in ids]
    at = spelled.index("K")
    assert spelled[at - 1 : at + 14] == ["▁", *"Kovemi", "▁", *"Brandel"]


def test_made_up_names_take_an_accent_only_from_those_given():
    """With accents, about ACCENT_SHARE of the names hold one of them (and no other non-ASCII
    letter), each word still one `latin` span; without, none does."""
    rng = np.random.default_rng(0)
    names = [made_up_name(rng, "çł") for _ in range(1000)]
    accented = [n for n in names if not n.isascii()]
    assert 100 < len(accented) < 300
    assert all(sum(c in "çł" for c in n) == 1 and len(n.encode()) == len(n) + 1 for n in accented)
    assert all(spans(f"我叫{n}。") == [(w, "latin") for w in n.split(" ")] for n in accented)
    assert all(made_up_name(rng).isascii() for _ in range(1000))


def test_accents_only_where_both_vocabularies_write_every_accented_letter(spm_models, tmp_path):
    """Both models of the fixture have byte fallback: every accented letter may be drawn. With an
    English model without it, none is (it would spell most of them as <unk>), though it has some
    ("é", "à", "ü") as pieces; one without byte fallback that has each of them as a piece
    (vocab.accented_pieces) writes them all, and they may be drawn again."""
    assert copied(spm_models, []).accents == ACCENTED_LETTERS
    lines = ["Il était une fois à Zürich.", "Tom is here."] * 20
    english = without_byte_fallback(tmp_path, lines, 60)
    plain = CopiedPairs(Split([]), (spm_models[0], english), CopySettings(1.0, 1, "zh", 100))
    assert plain.accents == "" and not has_byte_fallback(plain.sides[1]) and has_byte_fallback(plain.sides[0])
    assert not writes_accents(plain.sides[1])
    (tmp_path / "pieces").mkdir()
    english = without_byte_fallback(tmp_path / "pieces", lines, 120, ACCENTED_LETTERS)
    pieces = CopiedPairs(Split([]), (spm_models[0], english), CopySettings(1.0, 1, "zh", 100))
    assert not has_byte_fallback(pieces.sides[1]) and writes_accents(pieces.sides[1])
    assert pieces.accents == ACCENTED_LETTERS


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
    """One made-up span (a name may be several words: a span each) replaces the pair on both sides."""
    for seed in range(8):
        out = fill_slots(zh, en, np.random.default_rng(seed))
        assert out is not None
        made_zh, made_en, (span,) = out
        found = spans(made_zh)
        assert [s for s, _ in found] == span.split(" ") and {k for _, k in found} == {kind}
        assert set(found) <= set(spans(made_en))  # every English word is a latin token
        assert made_zh.replace(span, "") == zh.replace("三", "").replace("汤姆", "")
        assert span in made_en and "Tom" not in made_en and "hree" not in made_en


def test_placeholders_on_both_sides_are_filled_and_one_anchor_of_several():
    pair = ("⦅0⦆和汤姆在⦅1⦆号，玛丽不在。", "⦅0⦆ and Tom are at ⦅1⦆; Mary is not.")
    zh, en, made = fill_slots(*pair, np.random.default_rng(1))
    assert "⦅" not in zh + en
    assert (
        len(spans(zh)) == 3
        and {s for s, _ in spans(zh)} == set(made)
        and {s for s, _ in spans(zh)} <= {s for s, _ in spans(en)}
    )
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


def pieces(sp: spm.SentencePieceProcessor, ids: list[int]) -> list[str]:
    """Pieces as text, an ASCII byte piece as its character ("<0x51>" → "Q")."""
    return [chr(int(p[3:5], 16)) if sp.is_byte(int(i)) else p for i, p in ((i, sp.id_to_piece(int(i))) for i in ids)]


def holds_spelled(row: list[str], span: str) -> bool:
    """`span` one character per piece somewhere in `row`."""
    n = len(span)
    return any(row[i : i + n] == list(span) for i in range(len(row) - n + 1))


@pytest.mark.parametrize(
    ("text", "made"),
    [
        ("His company was set up in 2005.", ["2005"]),
        ("Qxvt and Kovemi met 12,000 people.", ["Qxvt", "12,000"]),
        ("Tomas is here", ["Tomas"]),  # at the start: the dummy "▁" kept
    ],
)
def test_spelled_spans_decode_to_the_same_text_one_character_per_piece(spm_models, text, made):
    sp = spm.SentencePieceProcessor(model_file=str(spm_models[1]))
    ids = spell_spans(sp, text, made)
    row, usual = pieces(sp, ids), pieces(sp, sp.encode(text))
    assert sp.decode(ids) == text and row != usual
    assert all(holds_spelled(row, span) for span in made)
    assert [p for p in row if len(p) > 2] == [
        p for p in usual if len(p) > 2 and not any(c.isdigit() or c.isupper() for c in p)
    ]  # other words as usual


def test_a_span_the_vocabulary_cannot_spell_keeps_the_usual_encoding(tmp_path):
    """Without byte fallback a character missing from the vocabulary would spell as <unk>: the text
    is encoded as usual (the copy is then not made, as any with <unk>)."""
    sp = spm.SentencePieceProcessor(model_file=str(without_byte_fallback(tmp_path, [en for _, en in SPM_PAIRS], 300)))
    assert spell_spans(sp, "I met Ωmega here.", ["Ωmega"]) == sp.encode("I met Ωmega here.")
    assert spell_spans(sp, "They meet at 12 birds.", ["birds"]) != sp.encode("They meet at 12 birds.")


class Split:
    """A split of stored pairs in windows of 100, as `nmt.data.encoded.ParallelSplit` serves them."""

    def __init__(self, pairs) -> None:
        self.pairs, self.bounds = pairs, np.unique(np.r_[np.arange(0, len(pairs), 100), len(pairs)])

    def __len__(self) -> int:
        return len(self.pairs)

    def window_bounds(self) -> np.ndarray:
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        window = self.pairs[self.bounds[k] : self.bounds[k + 1]]
        return tuple(np.array([len(p[side]) for p in window], dtype=np.int64) for side in (0, 1))

    def pair(self, i: int):
        return self.pairs[i]


def copied(spm_models, pairs, copies: float = 1.0, seed: int = 1, max_len: int = 200, src_lang: str = "zh"):
    return CopiedPairs(Split(pairs), tuple(spm_models), CopySettings(copies, seed, src_lang, max_len))


def texts(spm_models, pairs) -> list[tuple[str, str]]:
    sps = [spm.SentencePieceProcessor(model_file=str(m)) for m in spm_models]
    return [(sps[0].decode(list(map(int, s))), sps[1].decode(list(map(int, t)))) for s, t in pairs]


def ids(pairs) -> list[tuple[list[int], list[int]]]:
    return [(list(map(int, a)), list(map(int, b))) for a, b in pairs]


def with_slot(pairs) -> list[int]:
    return [i for i, p in enumerate(pairs) if fill_slots(*p, np.random.default_rng(0)) is not None]


def test_each_pair_with_a_slot_gives_copies_after_its_window(spm_models, spm_encoded):
    data = copied(spm_models, spm_encoded[:200])
    slots = with_slot(SPM_PAIRS[:200])
    assert data.copies == len(slots) > 20 and len(data) == 200 + data.copies
    assert ids(data.pair(i) for i in range(100)) == ids(spm_encoded[:100])  # own pairs first, in place
    first = int(data.window_bounds()[1])
    assert first == 100 + sum(i < 100 for i in slots)
    made = texts(spm_models, [data.pair(i) for i in range(100, first)])
    for (zh, en), i in zip(made, [i for i in slots if i < 100], strict=True):  # in the order of their pairs
        assert zh != SPM_PAIRS[i][0] and spans(zh)  # a made-up span, raw,
        assert {s for s, _ in spans(zh)} <= {s for s, _ in spans(en)}  # copied on the other side
    target = spm.SentencePieceProcessor(model_file=str(spm_models[1]))
    for i, (zh, _) in zip(range(100, first), made, strict=True):  # spelled on the target side only
        assert all(holds_spelled(pieces(target, data.pair(i)[1]), s) for s, _ in spans(zh))
    lengths = data.window_lengths(0)
    assert [list(x) for x in lengths] == [[len(data.pair(i)[side]) for i in range(first)] for side in (0, 1)]
    with pytest.raises(IndexError):
        data.pair(len(data))


def test_copies_hold_accented_names_the_target_spells_as_bytes(spm_models, spm_encoded):
    """Where both vocabularies can write accented letters (byte fallback), some copies' made-up
    names hold one; the target spells it as its UTF-8 bytes, which decode to the same name."""
    sps = [spm.SentencePieceProcessor(model_file=str(m)) for m in spm_models]
    pairs = [tuple(np.array(sp.encode(text)) for sp, text in zip(sps, ("汤姆在哪里？", "Where is Tom?"), strict=True))]
    data = copied(spm_models, pairs * 100, copies=2.0)
    made = [pair for window in data.made for pair in window]
    target = sps[1]
    accented = 0
    for (zh, en), (_, tgt) in zip(texts(spm_models, made), made, strict=True):
        for name in (s for s, kind in spans(zh) if kind == "latin" and not s.isascii()):
            accented += 1
            assert name in en and any(target.is_byte(int(i)) for i in tgt)
    assert 20 < accented < 60  # of 200 names, ACCENT_SHARE = 0.2


def test_the_number_of_copies_per_pair(spm_models, spm_encoded):
    slots = len(with_slot(SPM_PAIRS[:200]))
    assert copied(spm_models, spm_encoded[:200], copies=2.0).copies == 2 * slots
    half = copied(spm_models, spm_encoded[:200], copies=0.5).copies
    assert 0.3 * slots < half < 0.7 * slots
    two = texts(spm_models, [copied(spm_models, spm_encoded[:100], copies=2.0).pair(i) for i in range(100, 102)])
    assert two[0] != two[1]  # two copies of one pair hold different made-up spans


def test_the_source_side_follows_the_direction(spm_models, spm_encoded):
    """en→zh: the anchors' zh word is looked for in the target; the copies are the same."""
    flipped = [(t, s) for s, t in spm_encoded[:100]]
    reverse = CopiedPairs(Split(flipped), tuple(spm_models[::-1]), CopySettings(1.0, 1, "en", 200))
    forward = copied(spm_models, spm_encoded[:100])
    assert reverse.copies == forward.copies > 0
    assert ids(reverse.pair(i)[::-1] for i in range(100)) == ids(forward.pair(i) for i in range(100))
    made = range(100, len(forward))  # the same texts, each target side spelling its spans
    assert texts(spm_models[::-1], [reverse.pair(i) for i in made]) == [
        t[::-1] for t in texts(spm_models, [forward.pair(i) for i in made])
    ]


def test_the_copies_depend_on_the_seed_only(spm_models, spm_encoded):
    def made(seed: int) -> list:
        data = copied(spm_models, spm_encoded[:200], seed=seed)
        return ids(data.pair(i) for i in range(len(data)))

    assert made(1) == made(1) != made(2)


def test_copies_past_max_len_or_with_unk_are_not_made(spm_models, spm_encoded):
    slots = with_slot(SPM_PAIRS[:100])
    limit = max(max(len(a), len(b)) for a, b in (spm_encoded[i] for i in slots))
    data = copied(spm_models, spm_encoded[:100], max_len=limit)
    assert 0 < data.copies < len(slots)  # some grew past the limit
    assert all(max(len(a), len(b)) <= limit for a, b in (data.pair(i) for i in range(100, len(data))))
    s, t = spm_encoded[slots[0]]
    unk = [(s, np.concatenate([t, [UNK_ID]]))]
    assert copied(spm_models, unk).copies == 0 and copied(spm_models, spm_encoded[slots[0] : slots[0] + 1]).copies == 1


def test_missing_models_are_a_one_line_error(spm_models, tmp_path):
    with pytest.raises(NmtError, match=r"train.copy_spans: .*missing.model: SentencePiece model not found"):
        CopiedPairs(Split([]), (spm_models[0], tmp_path / "missing.model"), CopySettings(1.0, 1, "zh", 100))


@pytest.mark.slow
def test_a_run_with_copy_spans_trains_on_copies(tiny_run):
    """TrainData of a real run's data and vocabularies: with train.copy_spans the sampler batches
    the split's pairs and the copies (digits where the stored pairs say "seven"), joined pairs too;
    without, the split alone."""
    from conftest import ROOT, TINY_LEARNS

    from nmt.config import load_config

    info = SimpleNamespace(rank=0, world_size=1, is_main=False)

    def data(*overrides: str):
        config = load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, *overrides])
        return loop.TrainData.open(config, tiny_run, torch.device("cpu"), info, "fp32")

    plain, copies = data(), data("train.copy_spans=1.0")
    assert plain.copies == 0 and copies.copies > len(plain.dataset) // 20
    assert copies.sampler.kept == plain.sampler.kept + copies.copies
    assert "copy examples" in copies.describe() and "copy examples" not in plain.describe()
    made = [
        copies.tgt_tok.decode(list(map(int, copies.dataset.pair(i)[1])))
        for i in range(len(plain.dataset), len(copies.dataset))
    ]
    assert all(any(ch.isdigit() for ch in m) or any(ch.isupper() for ch in m[1:]) for m in made)
    joined = data("train.copy_spans=1.0", "train.concat_pairs=0.25")
    assert len(joined.dataset) == len(copies.dataset) + int(len(copies.dataset) * 0.25)

"""Copy examples made on the fly (``train.copy_spans``): training pairs in which a made-up name or
number stands on both sides, raw, so that the model itself learns to copy what it cannot translate.

Why: nmt's own runtimes hide names, numbers and URLs behind placeholders (`nmt.data.passthrough`),
but an exported model (Argos, CTranslate2 without nmt, transformers) sees them raw. A corpus like
Tatoeba holds few pairs with a span on both sides (about 1.3% of its training pairs), too few to
learn copying from; it holds many with an *aligned word pair* instead: 汤姆/Tom, 玛丽/Mary, 三/three.

What: each epoch, a seeded share of the training pairs is looked at (decoded to text); in those
that hold, on both sides, the same placeholder ``⦅i⦆`` (a masked span) or exactly one word pair of
`NAME_ANCHORS` / `NUMBER_ANCHORS`, every placeholder and one word pair are replaced by a new
made-up span (a name-like Latin token for a name, digits for a number, either for a placeholder),
the same text on both sides; the pair is encoded again (the best segmentation) as raw text is at
translation time. "我有三只猫。" / "I have three cats." may become "我有47只猫。" / "I have 47 cats.",
"汤姆在哪里？" / "Where is Tom?" "Kovemi在哪里？" / "Where is Kovemi?". Other pairs, and looked-at
pairs without such a slot, stay as stored; so do pairs that would grow past ``train.max_len``
or whose made-up span a vocabulary cannot spell (``<unk>``, no byte fallback).

Determinism: which pairs are looked at and what they get depend only on (train.seed, epoch, pair
index), as in `nmt.batches.subword_sampling`: the same on the prefetching thread, on any rank
and after a resume. Validation, test and decoding never see made-up pairs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.errors import NmtError

Pair = tuple[Sequence[int], Sequence[int]]

# (zh, en) word pairs a translation aligns one to one, frequent in everyday corpora (Tatoeba's
# names above all); a made-up span replaces one such pair where each side holds its word once
NAME_ANCHORS = (
    ("汤姆", "Tom"), ("玛丽", "Mary"), ("约翰", "John"), ("杰克", "Jack"), ("比尔", "Bill"),
    ("露西", "Lucy"), ("爱丽丝", "Alice"), ("迈克", "Mike"), ("鲍勃", "Bob"), ("吉姆", "Jim"),
    ("凯特", "Kate"), ("保罗", "Paul"), ("彼得", "Peter"), ("大卫", "David"), ("安妮", "Anne"),
)  # fmt: skip
NUMBER_ANCHORS = (
    ("两", "two"), ("三", "three"), ("四", "four"), ("五", "five"), ("六", "six"),
    ("七", "seven"), ("八", "eight"), ("九", "nine"), ("十", "ten"),
)  # fmt: skip
_PLACEHOLDER = re.compile("⦅\\d+⦆")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


def made_up_name(rng: np.random.Generator) -> str:
    """A Latin token a model cannot have learnt to translate: a name ("Kovemi"), an acronym
    ("QTX"), a brand ("iDavo") or letters with digits ("K7", "ZR-450")."""
    kind = rng.random()
    if kind < 0.6:  # a name of 2-3 syllables
        return _syllables(rng, int(rng.integers(2, 4))).capitalize()
    if kind < 0.8:  # an acronym
        return "".join(rng.choice(list("ABCDEFGHIKLMNPRSTVXZ"), size=int(rng.integers(2, 5))))
    if kind < 0.9:  # a brand written in mixed case
        return rng.choice(list("ei")) + _syllables(rng, 2).capitalize()
    letters = "".join(rng.choice(list("ABCDEGHKMRSTXZ"), size=int(rng.integers(1, 3))))
    return f"{letters}{'-' if rng.random() < 0.3 else ''}{rng.integers(1, 1000)}"


def _syllables(rng: np.random.Generator, n: int) -> str:
    """`n` consonant-vowel syllables: "kove", "mizaru"."""
    return "".join(rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(n))


def made_up_number(rng: np.random.Generator) -> str:
    """Digits as a text writes them: "7", "48", "1987", "3.5", "45%", "12,000"."""
    kind = rng.random()
    if kind < 0.45:
        return str(rng.integers(2, 100))
    if kind < 0.7:
        return str(rng.integers(100, 2100))
    if kind < 0.8:
        return f"{rng.integers(0, 100)}.{rng.integers(1, 10)}"
    if kind < 0.9:
        return f"{rng.integers(1, 100)}%"
    return f"{rng.integers(1, 100)},{rng.integers(0, 1000):03d}"


class SpanCopier:
    """Makes copy examples of training pairs (see the module docstring); it changes pieces, not
    which pairs or batches are drawn (those are `nmt.batches.batching.WindowSampler`'s)."""

    def __init__(
        self, src_model: Path, tgt_model: Path, *, src_lang: str, share: float, seed: int, max_len: int
    ) -> None:
        """`src_lang`: "zh" or "en", which side of the anchors the source is; `share`: the
        probability that a pair is looked at in an epoch (`train.copy_spans`)."""
        for path in (src_model, tgt_model):
            if not Path(path).is_file():
                raise NmtError(f"train.copy_spans: {path}: SentencePiece model not found (run `nmt vocab`)")
        self.sides = [spm.SentencePieceProcessor(model_file=str(p)) for p in (src_model, tgt_model)]
        self.zh_side = 0 if src_lang == "zh" else 1
        self.share, self.seed, self.max_len = share, seed, max_len

    def copy(self, indices: Sequence[int], pairs: Sequence[Pair], epoch: int) -> list[Pair]:
        """`pairs` (the pairs of training indices `indices`), some made into copy examples."""
        return [self._pair(int(i), p, epoch) for i, p in zip(indices, pairs, strict=True)]

    def _pair(self, index: int, pair: Pair, epoch: int) -> Pair:
        rng = np.random.default_rng([self.seed, epoch, index, 0xC0B1])
        if rng.random() >= self.share or any(UNK_ID in np.asarray(ids) for ids in pair):
            return pair
        texts = [sp.decode([int(t) for t in ids]) for sp, ids in zip(self.sides, pair, strict=True)]
        zh, en = texts[self.zh_side], texts[1 - self.zh_side]
        changed = fill_slots(zh, en, rng)
        if changed is None:
            return pair
        texts = [changed[0], changed[1]] if self.zh_side == 0 else [changed[1], changed[0]]
        encoded = [sp.encode(text, out_type=int) for sp, text in zip(self.sides, texts, strict=True)]
        if any(len(ids) > self.max_len or UNK_ID in ids for ids in encoded):
            return pair
        return encoded[0], encoded[1]


def fill_slots(zh: str, en: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """(zh, en) with every placeholder held by both sides and one anchor word pair replaced by
    made-up spans, the same text on both sides; None where the pair holds no such slot."""
    placeholders = sorted(set(_PLACEHOLDER.findall(zh)) & set(_PLACEHOLDER.findall(en)))
    anchors = [(z, e, made_up_name) for z, e in NAME_ANCHORS if _once(z, e, zh, en)]
    anchors += [(z, e, made_up_number) for z, e in NUMBER_ANCHORS if _once(z, e, zh, en)]
    if not placeholders and not anchors:
        return None
    for placeholder in placeholders:
        span = (made_up_name if rng.random() < 0.5 else made_up_number)(rng)
        zh, en = zh.replace(placeholder, span), en.replace(placeholder, span)
    if anchors:
        z, e, make = anchors[int(rng.integers(len(anchors)))]
        span = make(rng)
        zh, en = zh.replace(z, span), _word(e).sub(span, en)
    return zh, en


def _once(zh_word: str, en_word: str, zh: str, en: str) -> bool:
    return zh.count(zh_word) == 1 and len(_word(en_word).findall(en)) == 1


def _word(en_word: str) -> re.Pattern:
    """`en_word` as a whole word, capitalised too at a sentence's start ("Three of them")."""
    first = en_word[0]
    return re.compile(f"\\b[{first.lower()}{first.upper()}]{re.escape(en_word[1:])}\\b")

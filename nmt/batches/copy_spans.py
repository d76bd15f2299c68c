"""Copy examples (``train.copy_spans``): training pairs in which a made-up name or number stands
on both sides, raw, so that the model itself learns to copy what it cannot translate.

Why: nmt's own runtimes hide names, numbers and URLs behind placeholders (`nmt.data.passthrough`),
but an exported model (Argos, CTranslate2 without nmt, transformers) sees them raw. A corpus like
Tatoeba holds few pairs with a span on both sides (about 1.3% of its training pairs), too few to
learn copying from; it holds many with an *aligned word pair* instead: 汤姆/Tom, 玛丽/Mary, 三/three.

What: `CopiedPairs` wraps the training split like `nmt.batches.concat.ConcatenatedPairs`: window k
keeps its pairs at their indices and is followed by its copy examples. A pair that holds, on both
sides, the same placeholder ``⦅i⦆`` (a masked span) or exactly one word pair of `NAME_ANCHORS` /
`NUMBER_ANCHORS` gives ``train.copy_spans`` copies on average (1.5: one each, and a second for a
seeded half): every placeholder and one word pair replaced by a made-up span (a name-like Latin
token for a name, digits for a number, either for a placeholder), the same text on both sides.
The source is encoded as raw text is at translation time (the best segmentation); the target
spells each made-up span one character per piece (`spell_spans`), so that the model copies letter
by letter, in step with the source (decoded, the pieces give the same text). "我有三只猫。" / "I have
three cats." may give "我有47只猫。" / "I have 47 cats."; "汤姆在哪里？" / "Where is Tom?" gives
"Kovemi在哪里？" / "Where is Kovemi?". The pair itself stays, so 汤姆 is still translated. Where
both vocabularies write every accented letter (``vocab.accented_pieces``, or byte fallback on both
sides: ``vocab.byte_fallback_en``), a fifth of the made-up names hold one ("Brandél"), as
Tatoeba's do ("Timuçin").

The copies are made once, when training opens its data (every pair of the split that may give
one is decoded: about a second for Tatoeba's 24k pairs, minutes at tens of millions), from
(train.seed, window) alone: every epoch, rank and resumed run sees the same ones, and the batch
sampler batches them by their own lengths (made as batches are read, a longer copy would pad its
whole batch of similar lengths). A copy longer than ``train.max_len`` or holding ``<unk>`` (a
vocabulary without byte fallback that cannot spell the made-up span) is not made. Validation,
test and decoding read the split itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.config import ACCENTED_LETTERS
from nmt.errors import NmtError

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
_SALT = 0xC0B1  # keeps the copies' draws apart from the sampler's and the joined pairs' (seed, window) streams
_PLACEHOLDER = re.compile("⦅\\d+⦆")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# a made-up name may take a letter of nmt.config.ACCENTED_LETTERS where both vocabularies write
# each of them (as pieces, vocab.accented_pieces, or as bytes, vocab.byte_fallback_en), so that a
# model copies them too instead of stopping there
ACCENT_SHARE = 0.2  # of the made-up names, where both vocabularies write every accented letter
# of the made-up names, two or three words ("Kovemi Brandel", "QTX Oskit lun"): test sentences hold
# full names and phrases ("Terry Tate", "to get the sack"), which single-word copies taught a model
# to run together ("TerryTate"): nothing showed it a space inside a copy
SEVERAL_WORDS_SHARE = 0.2
_ONSETS = ("", "", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fr", "gr", "kr", "pl", "sh", "st", "th", "tr")  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "y", "ai", "ea", "ie", "oo", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "t", "m", "ck", "nd", "rt", "ll", "x", "b", "ng", "nn", "ss", "tt")


def made_up_name(rng: np.random.Generator, accents: str = "") -> str:
    """Latin text a model cannot have learnt to translate: a name ("Brandel", "Oskit"), random
    letters ("Qxvt"), an acronym ("QTX"), a brand ("iDavon") or letters with digits ("K7", "ZR-450");
    a share (SEVERAL_WORDS_SHARE) is two or three of them, one space apart ("Kovemi Brandel").
    Varied on purpose: names of one shape only (consonant-vowel syllables) taught a model to bend
    real names into that shape ("Bob" → "Bobo").

    `accents`: accented letters the vocabularies can write; with some, a share (ACCENT_SHARE) of
    the names has one lower-case letter replaced by one of them ("Brandél"). Without, no more is
    drawn than for a name without accents, so other runs' copies stay as they were."""
    words = 1 if rng.random() >= SEVERAL_WORDS_SHARE else 2 + int(rng.random() < 0.25)
    name = " ".join(_plain_name(rng) for _ in range(words))
    if accents and rng.random() < ACCENT_SHARE:
        lower = [i for i, c in enumerate(name) if c in _LETTERS]
        if lower:
            i = lower[int(rng.integers(len(lower)))]
            name = name[:i] + str(rng.choice(list(accents))) + name[i + 1 :]
    return name


def has_byte_fallback(sp: spm.SentencePieceProcessor) -> bool:
    """Whether `sp` writes any character, as its UTF-8 bytes where it has no piece for it."""
    return sp.is_byte(sp.piece_to_id("<0xC3>"))


def writes_accents(sp: spm.SentencePieceProcessor) -> bool:
    """Whether `sp` writes every letter of ACCENTED_LETTERS without <unk>: by byte fallback, or each a piece."""
    return has_byte_fallback(sp) or all(sp.piece_to_id(c) != UNK_ID for c in ACCENTED_LETTERS)


def _plain_name(rng: np.random.Generator) -> str:
    """`made_up_name` without accents."""
    kind = rng.random()
    if kind < 0.5:  # a name of 1-3 syllables with onsets, vowels and codas of English names
        return _syllables(rng, int(rng.integers(1, 4))).capitalize()
    if kind < 0.65:  # letters at random, capitalised or not
        word = "".join(rng.choice(list(_LETTERS), size=int(rng.integers(2, 9))))
        return word.capitalize() if rng.random() < 0.7 else word
    if kind < 0.8:  # an acronym
        return "".join(rng.choice(list(_LETTERS.upper()), size=int(rng.integers(2, 6))))
    if kind < 0.9:  # a brand written in mixed case
        return rng.choice(list("eiy")) + _syllables(rng, int(rng.integers(1, 3))).capitalize()
    letters = "".join(rng.choice(list(_LETTERS.upper()), size=int(rng.integers(1, 4))))
    return f"{letters}{'-' if rng.random() < 0.3 else ''}{rng.integers(1, 1000)}"


def _syllables(rng: np.random.Generator, n: int) -> str:
    """`n` syllables of an onset, a vowel and a coda, each possibly empty: "bran", "del", "os"."""
    parts = (_ONSETS, _NUCLEI, _CODAS)
    return "".join(str(rng.choice(part)) for _ in range(n) for part in parts)


def made_up_number(rng: np.random.Generator) -> str:
    """Digits as a text writes them: "7", "48", "305", "1987", "300", "3.5", "45%", "12,000". Years
    and round numbers are drawn on purpose: a model copies a run of equal digits worst ("2005" →
    "205", "300" → "30")."""
    kind = rng.random()
    if kind < 0.2:
        return str(rng.integers(0, 10))
    if kind < 0.35:
        return str(rng.integers(10, 100))
    if kind < 0.5:
        return str(rng.integers(100, 1000))
    if kind < 0.65:  # a year
        return str(rng.integers(1900, 2031))
    if kind < 0.8:  # a round number: 20, 300, 5000, 60000
        return f"{rng.integers(1, 10)}{'0' * int(rng.integers(1, 5))}"
    if kind < 0.87:
        return f"{rng.integers(0, 100)}.{rng.integers(1, 10)}"
    if kind < 0.94:
        return f"{rng.integers(1, 100)}%"
    return f"{rng.integers(1, 100)},{rng.integers(0, 1000):03d}"


@dataclass(frozen=True)
class CopySettings:
    """What `CopiedPairs` makes: `copies` per pair with an aligned slot (``train.copy_spans``), drawn
    from `seed` (train.seed); `src_lang` ("zh" or "en") says which side holds the anchors' Chinese
    word; copies longer than `max_len` pieces (``train.max_len``) are not made."""

    copies: float
    seed: int
    src_lang: str
    max_len: int


class CopiedPairs:
    """`dataset` (a `LengthWindows` with `pair(i)`) with copy examples after each window's own pairs
    (see the module docstring).

    Args:
        dataset: the training split (`nmt.data.encoded.ParallelSplit` or alike).
        models: the (source, target) SentencePiece model files.
        settings: `CopySettings` (``train.copy_spans``, its seed, direction and length limit).
    """

    def __init__(self, dataset, models: tuple[Path, Path], settings: CopySettings) -> None:
        for path in models:
            if not Path(path).is_file():
                raise NmtError(f"train.copy_spans: {path}: SentencePiece model not found (run `nmt vocab`)")
        self.dataset, self.settings = dataset, settings
        self.sides = [spm.SentencePieceProcessor(model_file=str(p)) for p in models]
        self.zh_side = 0 if settings.src_lang == "zh" else 1  # which of (source, target) is Chinese
        # accented names only where both sides write every letter: other vocabularies would spell
        # most accents as <unk> (the copy is then not made), and the copies stay as they were
        self.accents = ACCENTED_LETTERS if all(map(writes_accents, self.sides)) else ""
        self.base = np.asarray(dataset.window_bounds(), dtype=np.int64)  # (S+1,) the split's own bounds
        self.made = [self._make(k) for k in range(len(self.base) - 1)]  # per window: [(src ids, tgt ids)]
        counts = np.array([len(m) for m in self.made], dtype=np.int64)
        self.bounds = np.concatenate(([0], np.cumsum(np.diff(self.base) + counts)))  # (S+1,)

    def __len__(self) -> int:
        return int(self.bounds[-1])

    @property
    def copies(self) -> int:
        """How many copy examples were made."""
        return len(self) - int(self.base[-1])

    def window_bounds(self) -> np.ndarray:
        """(S+1,) int64: window k holds pairs bounds[k]:bounds[k+1], its own first."""
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) pieces of window k's pairs, copies last (without BOS/EOS)."""
        own = self.dataset.window_lengths(k)
        made = [np.array([len(p[side]) for p in self.made[k]], dtype=own[side].dtype) for side in (0, 1)]
        return np.concatenate((own[0], made[0])), np.concatenate((own[1], made[1]))

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, tgt) ids of pair i, no BOS/EOS: a pair of the split, or a copy example."""
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} out of range ({len(self)} with copy examples)")
        k = int(np.searchsorted(self.bounds, i, side="right")) - 1
        j = i - int(self.bounds[k])
        own = int(self.base[k + 1] - self.base[k])
        return self.dataset.pair(int(self.base[k]) + j) if j < own else self.made[k][j - own]

    def _make(self, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Window k's copy examples, in the order of the pairs they come from."""
        rng = np.random.default_rng((self.settings.seed, k, _SALT))
        whole, part = divmod(self.settings.copies, 1.0)
        out = []
        for i in range(int(self.base[k]), int(self.base[k + 1])):
            wanted = int(whole) + int(rng.random() < part)
            if wanted:
                out += self._copies(self.dataset.pair(i), wanted, rng)
        return out

    def _copies(self, pair: tuple[np.ndarray, np.ndarray], wanted: int, rng: np.random.Generator) -> list:
        """Up to `wanted` copy examples of `pair` (none where it holds no aligned slot)."""
        if any(UNK_ID in np.asarray(ids) for ids in pair):
            return []
        texts = [sp.decode([int(t) for t in ids]) for sp, ids in zip(self.sides, pair, strict=True)]
        zh_side, out = self.zh_side, []
        for _ in range(wanted):
            filled = fill_slots(texts[zh_side], texts[1 - zh_side], rng, self.accents)
            if filled is None:
                return []
            zh, en, made_up = filled
            src, tgt = (zh, en) if zh_side == 0 else (en, zh)
            encoded = (self.sides[0].encode(src, out_type=int), spell_spans(self.sides[1], tgt, made_up))
            ids = [np.asarray(x, dtype=np.int32) for x in encoded]
            if all(len(x) <= self.settings.max_len and UNK_ID not in x for x in ids):
                out.append((ids[0], ids[1]))
        return out


def fill_slots(zh: str, en: str, rng: np.random.Generator, accents: str = "") -> tuple[str, str, list[str]] | None:
    """(zh, en, the made-up spans) with every placeholder held by both sides and one anchor word
    pair replaced by made-up spans, the same text on both sides; None where the pair holds no
    such slot. `accents`: as `made_up_name` takes it."""
    placeholders = sorted(set(_PLACEHOLDER.findall(zh)) & set(_PLACEHOLDER.findall(en)))
    name = partial(made_up_name, accents=accents)
    anchors = [(z, e, name) for z, e in NAME_ANCHORS if _once(z, e, zh, en)]
    anchors += [(z, e, made_up_number) for z, e in NUMBER_ANCHORS if _once(z, e, zh, en)]
    if not placeholders and not anchors:
        return None
    made = []
    for placeholder in placeholders:
        made.append((name if rng.random() < 0.5 else made_up_number)(rng))
        zh, en = zh.replace(placeholder, made[-1]), en.replace(placeholder, made[-1])
    if anchors:
        z, e, make = anchors[int(rng.integers(len(anchors)))]
        made.append(make(rng))
        zh, en = zh.replace(z, made[-1]), _word(e).sub(made[-1], en)
    return zh, en, made


def spell_spans(sp: spm.SentencePieceProcessor, text: str, spans: list[str]) -> list[int]:
    """`text` encoded by `sp` as usual, except that each piece overlapping one of `spans` is spelled
    one character per piece ("▁", "K", "o", "v", ...; bytes where `sp` lacks the character): the same
    text once decoded, but a copy the model can learn character by character, aligned with the
    source's letters and digits ("2005" as "▁20" "0" "5" taught a model to write "205").

    Returns the usual encoding where the spelling would not decode to the same text (a character
    neither in the vocabulary nor spelt by byte fallback)."""
    usual = sp.encode(text, return_type="proto").pieces
    usual_ids = [p.id for p in usual]
    taken = _span_bytes(text, spans)  # (n_bytes,) bool: the bytes of `text` inside a span
    ids, run = [], []  # run: a piece and the zero-width pieces before it (the dummy "▁", leading bytes)
    for piece in usual:
        run.append(piece)
        if piece.end > piece.begin:
            ids += _spelled(sp, text, run) if taken[run[0].begin : piece.end].any() else [p.id for p in run]
            run = []
    ids += [p.id for p in run]
    return ids if sp.decode(ids) == sp.decode(usual_ids) else usual_ids


def _span_bytes(text: str, spans: list[str]) -> np.ndarray:
    """(len(text.encode()),) bool: True on the UTF-8 bytes of each whole-token occurrence of a span."""
    taken = np.zeros(len(text.encode()), dtype=bool)
    for span in set(spans):
        for m in re.finditer(f"(?<![A-Za-z0-9]){re.escape(span)}(?![A-Za-z0-9])", text):
            begin = len(text[: m.start()].encode())
            taken[begin : begin + len(m.group().encode())] = True
    return taken


def _spelled(sp: spm.SentencePieceProcessor, text: str, run: list) -> list[int]:
    """The pieces of `run` spelled one character per piece ("▁20" → "▁", "2", "0"); a character
    missing from the vocabulary as its UTF-8 bytes ("<0xC3>", "<0x80>"), <unk> without them."""
    surface = text.encode()[run[0].begin : run[-1].end].decode()
    ids = [sp.piece_to_id("▁")] if run[0].piece.startswith("▁") and not surface.startswith(" ") else []
    for char in surface:
        one = sp.piece_to_id("▁" if char == " " else char)
        if one == sp.unk_id():
            ids += [sp.piece_to_id(f"<0x{b:02X}>") for b in char.encode()]
        else:
            ids.append(one)
    return ids


def _once(zh_word: str, en_word: str, zh: str, en: str) -> bool:
    return zh.count(zh_word) == 1 and len(_word(en_word).findall(en)) == 1


def _word(en_word: str) -> re.Pattern:
    """`en_word` as a whole word, capitalised too at a sentence's start ("Three of them")."""
    first = en_word[0]
    return re.compile(f"\\b[{first.lower()}{first.upper()}]{re.escape(en_word[1:])}\\b")

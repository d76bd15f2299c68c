"""Text normalisation: what training does to each side, and so what translation, validation and
pass-through must do to the same text (NFKC, Traditional→Simplified on the Chinese side,
whitespace collapsed; `strip_text` for the references of valid/test).

Both conversions take a fast path that gives exactly what the full conversion gives:

- NFKC is skipped when `unicodedata.is_normalized("NFKC", text)` (a quick check in C).
- Traditional→Simplified (`to_simplified`) runs OpenCC's `t2s` (`full_t2s`, the pure-Python
  reimplementation, tens of µs a sentence) only where it must. The conversion is one group
  [TSPhrases, TSCharacters]: inside each separator-delimited segment, the longest phrase key
  matches first (identity entries such as 乾隆 included, which protect their characters), and what
  no phrase covers is mapped character by character. So a sentence with no character that any
  entry changes (`_T2S.changing`) comes back as it is, and one in which no phrase key occurs is
  the character map (`str.translate`); only sentences holding a phrase key go to OpenCC. The
  shortcut is built from the converter's own dictionaries and is used only when they have that
  shape (one group, phrases then single characters, no changing separator); otherwise every
  sentence goes to OpenCC. tests/data/test_normalize.py checks it against `full_t2s` on
  generated text and, where present, on every sentence of the corpora in ../shared/data.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from nmt.config import DataConfig

_LINE_BREAKS = re.compile(r"[\t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def strip_text(text: str) -> str:
    """What valid/test get: line breaks and tabs become spaces, surrounding whitespace goes."""
    return _LINE_BREAKS.sub(" ", text).strip()


@functools.lru_cache(maxsize=1)
def _opencc() -> Any:  # opencc.OpenCC (untyped)
    import opencc

    converter = opencc.OpenCC("t2s")
    converter.convert("")  # loads the dictionaries
    return converter


def full_t2s(text: str) -> str:
    """OpenCC's t2s conversion of the whole text, no shortcut: the reference `to_simplified` equals."""
    return _opencc().convert(text)


def _first(value: str) -> str:
    """What OpenCC writes for a dictionary value: of "干 乾" (alternatives), the first."""
    return value.split(" ")[0]


class _T2S:
    """The t2s shortcut, built from the converter's dictionaries (see the module docstring)."""

    def __init__(self, converter: Any) -> None:
        self.convert = converter.convert
        self.known = self.exact = False  # known: the converter's dictionaries were read as expected
        try:
            self._read(converter)
        except (AttributeError, TypeError, ValueError):  # another opencc: every sentence goes to it
            self.known = self.exact = False

    def _read(self, converter: Any) -> None:
        chain = converter._dict_chain_data  # [[(max_len, min_len, {key: value}), ...], ...]
        self.changing = frozenset(
            c for group in chain for _, _, d in group for k, v in d.items() if k != _first(v) for c in k
        )
        self.known = True
        if len(chain) == 1 and len(chain[0]) == 2 and chain[0][1][:2] == (1, 1):
            (_, _, phrases), (_, _, chars) = chain[0]
            changed = {k: _first(v) for k, v in chars.items() if k != _first(v)}
            self.table = str.maketrans(changed)
            self.phrase = re.compile("|".join(map(re.escape, sorted(phrases, key=len, reverse=True))))
            self.exact = not any(converter.split_chars_re.fullmatch(k) for k in changed)

    def __call__(self, text: str) -> str:
        if not self.known:
            return self.convert(text)
        if self.changing.isdisjoint(text):
            return text
        if self.exact and self.phrase.search(text) is None:
            return text.translate(self.table)
        return self.convert(text)


@functools.lru_cache(maxsize=1)
def _t2s() -> _T2S:
    return _T2S(_opencc())


def to_simplified(text: str) -> str:
    """Traditional→Simplified, equal to `full_t2s(text)`, through the shortcut where it applies."""
    return _t2s()(text)


def normalize_text(text: str, data: DataConfig, chinese: bool) -> str:
    """NFKC (`data.nfkc`), Traditional→Simplified when `chinese` (`data.t2s`), whitespace collapsed."""
    if data.nfkc and not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    if chinese and data.t2s:
        text = to_simplified(text)
    return " ".join(text.split())


def normalize_source(text: str, data: DataConfig) -> str:
    """What training did to the source side: NFKC, Traditional→Simplified (zh), whitespace collapsed."""
    return normalize_text(text, data, data.src_lang.startswith("zh"))


def normalize_target(text: str, data: DataConfig) -> str:
    return normalize_text(text, data, data.tgt_lang.startswith("zh"))

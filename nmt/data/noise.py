"""Tests for the noise of scraped parallel text, one per kind of noise (`data.filters`):

- `script_share`: how much of a side is in the script its language is written in. Lengths are
  scaled as the length-ratio rule scales them (`nmt.data.clean`): a Han character counts 1, a
  Latin letter 1/3 (about three Latin letters per Han character in zh-en text), any other letter 1
  (kana, Hangul, Cyrillic...); digits, punctuation and spaces do not count. So `我爱 AI` is 0.75
  Han and an untranslated English line on the Chinese side is 0.
- `markup`: a side that is nothing but URLs, e-mail addresses, HTML tags or entities and
  punctuation (a scraped link, a stray `<br/>`), or that holds what scraping leaves behind in a
  sentence: a JSON record (`{"GLOSS":[...]}`), BBCode (`[font=宋体]`), an HTML entity (`&quot;`).
  Tags inside a sentence are kept: technical text mentions them (`the <xs:sequence> element`).
- `near_key`: the text with case, spaces and punctuation dropped: two pairs with equal keys on
  both sides are near-duplicates (`他走了。`/`He left.` and `他走了！`/`he left!`), and a pair whose
  two sides have the same key is an untranslated copy (`identical`).

Each runs on normalised text (NFKC, Traditional→Simplified), as the cleaning rules see it.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

LATIN_WEIGHT = 1 / 3  # a Latin letter's share of one Han character's length (nmt.data.clean.LATIN_CHARS_PER_HANZI)

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_LETTER = re.compile(r"[^\W\d_]")  # any letter of any script
_MARKUP = re.compile(
    r"(?:https?://|ftp://|www\.)\S+"  # a URL
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # an e-mail address
    r"|</?[A-Za-z][^<>]*>"  # an HTML/XML tag
    r"|&(?:#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);"  # an HTML entity
)
_RESIDUE = re.compile(
    r'\{\s*"[^"]+"\s*:'  # a JSON record
    r"|\[/?(?:color|font|size|b|i|u|url|img|quote)(?:=[^\]]*)?\]"  # BBCode
    r"|&(?:#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);"  # an HTML entity
)


def script_share(text: str, han: bool) -> float | None:
    """The share of `text`'s scaled letter length in its own script: Han when `han`, else Latin;
    None when it has no letters (numbers, symbols: nothing to judge)."""
    n_han = len(_HAN.findall(text))
    n_latin = len(_LATIN.findall(text))
    n_other = len(_LETTER.findall(text)) - n_han - n_latin
    total = n_han + n_latin * LATIN_WEIGHT + n_other
    if total <= 0:
        return None
    return (n_han if han else n_latin * LATIN_WEIGHT) / total


def markup(text: str) -> bool:
    """True when `text` is only markup (URLs, e-mail addresses, tags, entities; that removed, no
    letter or digit is left) or holds scraping residue (a JSON record, BBCode, an HTML entity)."""
    if _RESIDUE.search(text):
        return True
    rest, found = _MARKUP.subn(" ", text)
    return found > 0 and not any(ch.isalnum() for ch in rest)


def near_key(text: str) -> str:
    """The text case-folded, with every space, punctuation mark and symbol dropped."""
    return "".join(ch for ch in text.casefold() if unicodedata.category(ch)[0] not in "PZSC")


def near_hash(src: str, tgt: str) -> int:
    """64-bit blake2b of both sides' `near_key`s: the key a near-duplicate shares."""
    text = near_key(src) + "\t" + near_key(tgt)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")

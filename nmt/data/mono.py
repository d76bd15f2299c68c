"""Monolingual text: read, cleaned like a parallel corpus, and guarded against the test sets.

Back-translation (`nmt.decode.backtranslate`) turns sentences of the target language into
synthetic pairs. They come from a plain text file (one sentence per line) or a mirror directory
holding `train.<lang>` (e.g. `../shared/data/tatoeba-mono-en/train.en`). Cleaning drops, and
counts by rule:

    bad_line   invalid UTF-8
    empty      nothing left after whitespace is stripped
    control    a control character other than whitespace (U+0000-U+001F, U+007F-U+009F)
    too_long   more than `data.max_chars` characters
    duplicate  the same sentence again (after normalisation)
    overlap    equal (after normalisation) to a validation or test reference of the run: training
               on it would leak the evaluation sets into the model

Kept sentences stay as they were read (only surrounding whitespace goes): the real side of a
synthetic pair is verbatim.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nmt.config import DataConfig
from nmt.data.normalize import normalize_source
from nmt.errors import NmtError

MONO_RULES = ("bad_line", "empty", "control", "too_long", "duplicate", "overlap")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass
class MonoText:
    """Cleaned monolingual sentences and what was dropped (`read == len(lines) + sum(dropped)`)."""

    lines: list[str]
    read: int = 0
    dropped: Counter = field(default_factory=Counter)

    def report(self) -> dict:
        return {"read": self.read, "kept": len(self.lines), "dropped": {r: self.dropped[r] for r in MONO_RULES}}


def mono_file(path: Path, lang: str) -> Path:
    """The text file of `path`: the file itself, or a mirror directory's `train.<lang>`."""
    path = Path(path)
    if path.is_dir():
        path = path / f"train.{lang}"
    if not path.is_file():
        raise NmtError(f"{path}: monolingual text not found (a file, or a directory with train.{lang})")
    return path


def read_mono(path: Path, data: DataConfig, held_out: Iterable[str] = ()) -> MonoText:
    """Clean the sentences of `path` (see the module docstring). `held_out`: the run's validation
    and test references in this language; a sentence equal to one is dropped as `overlap`.
    `data` is the config of the run the text will be *translated by* (its source side)."""
    guard = {_key(line, data) for line in held_out}
    seen: set[bytes] = set()
    out = MonoText([])
    with open(path, "rb") as f:
        for raw in f:
            out.read += 1
            rule, text = _clean(raw, data)
            if rule is None:
                key = _key(text, data)
                rule = "overlap" if key in guard else "duplicate" if key in seen else None
                seen.add(key)
            if rule is None:
                out.lines.append(text)
            else:
                out.dropped[rule] += 1
    return out


def _clean(raw: bytes, data: DataConfig) -> tuple[str | None, str]:
    """(the rule that drops the line or None, its text)."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff").strip()
    except UnicodeDecodeError:
        return "bad_line", ""
    if not text:
        return "empty", ""
    if _CONTROL.search(text):
        return "control", ""
    if len(text) > data.max_chars:
        return "too_long", ""
    return None, text


def _key(text: str, data: DataConfig) -> bytes:
    """What two sentences must share to be the same: their normalised text (as a short digest)."""
    return hashlib.blake2b(normalize_source(text, data).encode("utf-8"), digest_size=16).digest()

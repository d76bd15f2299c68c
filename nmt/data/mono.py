"""Monolingual text: read, cleaned like a parallel corpus, and guarded against the test sets.

Back-translation (`nmt.decode.backtranslate`) turns sentences of the target language into
synthetic pairs. They come from a plain text file (one sentence per line), a mirror directory
holding `train.<lang>` (e.g. `../shared/data/tatoeba-mono-en/train.en`), or a hub dataset of
text rows, named `hub:NAME?config=C&split=S&column=K&limit=N` (defaults: no config, split train,
column text, every row; `column` may be a dotted path into nested rows such as `translation.en`),
e.g. `hub:Salesforce/wikitext?config=wikitext-103-raw-v1` (rows {"text": ...}). Cleaning drops,
and counts by rule:

    bad_line   invalid UTF-8 (a hub row: no text in its column)
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
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nmt.config import DataConfig
from nmt.data.hub import stream_rows
from nmt.data.normalize import normalize_source
from nmt.errors import NmtError

MONO_RULES = ("bad_line", "empty", "control", "too_long", "duplicate", "overlap")
HUB_PREFIX = "hub:"
HUB_KEYS = ("config", "split", "column", "limit")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass
class MonoText:
    """Cleaned monolingual sentences and what was dropped (`read == len(lines) + sum(dropped)`)."""

    lines: list[str]
    read: int = 0
    dropped: Counter = field(default_factory=Counter)

    def report(self) -> dict:
        return {"read": self.read, "kept": len(self.lines), "dropped": {r: self.dropped[r] for r in MONO_RULES}}


@dataclass(frozen=True)
class HubText:
    """A hub dataset of text rows (see the module docstring for the `hub:` spelling)."""

    dataset: str
    config: str | None = None
    split: str = "train"
    column: str = "text"  # dotted path into nested rows
    limit: int = 0  # rows read at most; 0 = all

    def __str__(self) -> str:
        query = {"config": self.config, "split": self.split, "column": self.column, "limit": self.limit or None}
        return f"{HUB_PREFIX}{self.dataset}?{urllib.parse.urlencode({k: v for k, v in query.items() if v})}"


def mono_source(spec: str | Path, lang: str) -> Path | HubText:
    """What `--mono` names: a `hub:` dataset, a text file, or a mirror directory's `train.<lang>`."""
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        return _parse_hub(text)
    path = Path(spec)
    if path.is_dir():
        path = path / f"train.{lang}"
    if not path.is_file():
        raise NmtError(f"{path}: monolingual text not found (a file, a directory with train.{lang}, or hub:NAME)")
    return path


def _parse_hub(spec: str) -> HubText:
    name, _, query = spec.removeprefix(HUB_PREFIX).partition("?")
    if not name.strip():
        raise NmtError(f"--mono {spec!r}: name a dataset, e.g. hub:Salesforce/wikitext?config=wikitext-103-raw-v1")
    fields: dict = {}
    for key, values in urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=False).items():
        if key not in HUB_KEYS:
            raise NmtError(f"--mono {spec!r}: unknown key {key!r} (expected {', '.join(HUB_KEYS)})")
        fields[key] = values[-1]
    if "limit" in fields:
        if not fields["limit"].isdigit():
            raise NmtError(f"--mono {spec!r}: limit={fields['limit']!r} is not a whole number")
        fields["limit"] = int(fields["limit"])
    return HubText(name.strip(), **fields)


def read_mono(source: Path | HubText, data: DataConfig, held_out: Iterable[str] = ()) -> MonoText:
    """Clean the sentences of `source` (see the module docstring). `held_out`: the run's validation
    and test references in this language; a sentence equal to one is dropped as `overlap`.
    `data` is the config of the run the text will be *translated by* (its source side)."""
    guard = {_key(line, data) for line in held_out}
    seen: set[bytes] = set()
    out = MonoText([])
    for raw in _raw_lines(source):
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


def _raw_lines(source: Path | HubText) -> Iterator[bytes | str | None]:
    """A file's lines as bytes, or a hub split's texts (None where a row has none)."""
    if isinstance(source, Path):
        with open(source, "rb") as f:
            yield from f
        return
    for n, row in enumerate(stream_rows(source.dataset, source.config, source.split), 1):
        value: object = row
        for part in source.column.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        yield value if isinstance(value, str) else None
        if n == source.limit:
            return


def _clean(raw: bytes | str | None, data: DataConfig) -> tuple[str | None, str]:
    """(the rule that drops the line or None, its text)."""
    if raw is None:
        return "bad_line", ""
    try:
        text = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).removeprefix("\ufeff").strip()
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

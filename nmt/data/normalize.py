"""Text normalisation: what training does to each side, and so what translation, validation and
pass-through must do to the same text (NFKC, Traditional→Simplified on the Chinese side,
whitespace collapsed; `strip_text` for the references of valid/test)."""

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
def _t2s() -> Any:  # opencc.OpenCC (untyped)
    import opencc

    return opencc.OpenCC("t2s")


def _normalize(text: str, data: DataConfig, chinese: bool) -> str:
    if data.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if chinese and data.t2s:
        text = _t2s().convert(text)
    return " ".join(text.split())


def normalize_source(text: str, data: DataConfig) -> str:
    """What training did to the source side: NFKC, Traditional→Simplified (zh), whitespace collapsed."""
    return _normalize(text, data, data.src_lang.startswith("zh"))


def normalize_target(text: str, data: DataConfig) -> str:
    return _normalize(text, data, data.tgt_lang.startswith("zh"))

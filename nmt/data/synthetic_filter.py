"""Rules for back-translated pairs only, on top of the cleaning every pair gets (`nmt.data.clean`),
and the cap that keeps real pairs at least as many as synthetic ones.

A synthetic pair's source side was written by a reverse model; its target side is real text.
A weak reverse model fails in recognisable ways, which real pairs rarely show:

- `bt_ratio`: a scaled length ratio (`nmt.data.clean.length_ratio`: a Chinese side counts its
  characters, another side its characters / 3) above `data.backtranslation.max_ratio`, tighter
  than `data.max_ratio` (a translation that stopped early, or ran on).
- `char_run`: the synthetic side repeats one character more than `max_char_run` times in a row
  ("我把把把把"); digits are exempt (10000).
- `token_share`: one token (a Chinese character, else a lower-cased word) is more than
  `max_token_share` of the synthetic side's tokens, for sides of at least `SHARE_MIN_TOKENS`
  tokens (a loop of several pieces).

The cap (`ratio`): at most `ratio` × the real lines written (real_upsample copies count)
synthetic pairs are kept, drawn uniformly with the data seed (`nmt.data.subset.keep_subset`).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from nmt.config import DataConfig
from nmt.data.clean import Cleaned, length_ratio, unit_path
from nmt.data.subset import keep_subset

SYNTHETIC_RULES = ("bt_ratio", "char_run", "token_share")
SHARE_MIN_TOKENS = 8  # shorter sides are not judged by token share (two of five is ordinary)
_PUNCT = re.compile(r"[\W_]+", re.UNICODE)


def longest_run(text: str) -> int:
    """The most times one character other than a digit or a space follows itself in `text`."""
    best, run, last = 0, 0, ""
    for ch in text:
        run = run + 1 if ch == last else 1
        last = ch
        if not (ch.isdigit() or ch.isspace()):
            best = max(best, run)
    return best


def top_token_share(text: str, chinese: bool) -> tuple[float, int]:
    """(share of the most frequent token, number of tokens) of `text`: Chinese characters (other
    characters grouped into words) on a Chinese side, lower-cased words elsewhere; punctuation
    is not a token."""
    if chinese:
        tokens = [t for t in re.findall(r"[\u3400-\u9fff]|[^\W\u3400-\u9fff_]+", text)]
    else:
        tokens = [t for t in (_PUNCT.sub(" ", text.lower())).split()]
    if not tokens:
        return 0.0, 0
    return Counter(tokens).most_common(1)[0][1] / len(tokens), len(tokens)


def synthetic_reason(src: str, tgt: str, data: DataConfig) -> str | None:
    """The first rule of SYNTHETIC_RULES that drops the pair (`src` is the synthetic side, in
    `data.src_lang`), or None to keep it. Settings: `data.backtranslation`."""
    bt = data.backtranslation
    if length_ratio(src, tgt, data) > bt.max_ratio:
        return "bt_ratio"
    if bt.max_char_run and longest_run(src) > bt.max_char_run:
        return "char_run"
    share, tokens = top_token_share(src, data.src_lang.startswith("zh"))
    if tokens >= SHARE_MIN_TOKENS and share > bt.max_token_share:
        return "token_share"
    return None


def filter_synthetic(cleaned: Cleaned, masks: list[np.ndarray], data: DataConfig) -> tuple[list, dict[str, int]]:
    """`masks` (one bool array per cleaned unit) with the pairs that a synthetic rule drops set
    False, and how many each rule dropped (among those still True)."""
    dropped = dict.fromkeys(SYNTHETIC_RULES, 0)
    out = []
    for i, mask in enumerate(masks):
        mask = mask.copy()
        with (
            open(unit_path(cleaned.folder, i, ".src"), encoding="utf-8") as a,
            open(unit_path(cleaned.folder, i, ".tgt"), encoding="utf-8") as b,
        ):
            for j, (s, t) in enumerate(zip(a, b, strict=True)):
                if mask[j] and (reason := synthetic_reason(s.rstrip("\n"), t.rstrip("\n"), data)):
                    mask[j] = False
                    dropped[reason] += 1
        out.append(mask)
    return out, dropped


def cap_synthetic(masks: list[np.ndarray], real_lines: int, data: DataConfig) -> tuple[list, int]:
    """`masks` with at most floor(`data.backtranslation.ratio` × `real_lines`) pairs left True,
    drawn uniformly (seeded by `data.seed`), and how many the cap dropped. A ratio of None keeps all."""
    ratio = data.backtranslation.ratio
    if ratio is None:
        return masks, 0
    return keep_subset(masks, math.floor(ratio * real_lines), data.seed)

"""Span sets for scoring the raw path (`nmt eval --no-passthrough`): the lines of the mirror's
corpora whose source and reference share a pass-through span, by the score's own rules
(`nmt.data.passthrough.score_lines`: each side normalised as in training, every span kind).

    python scripts/span_sets.py --mirror ../shared/data --out runs/spans
    python scripts/bench_raw_path.py --spans runs/spans RUN...   # the table of every set

Sets, each as OUT/NAME.zh and OUT/NAME.en:

| name | from | use |
|---|---|---|
| valid | the Tatoeba validation split | decide |
| news40 | newsdev2017, lines of at most 40 Chinese characters | decide |
| mirror | 400 lines of Youdao examples and AI Challenger (at most 60 characters), seeded sample | decide |
| mirror-words | 200 more of those lines holding a span of several words or two Latin spans | decide |
| test | the Tatoeba test split | report only, never decide on |

Youdao and AI Challenger are corpora no recipe trains on (licence unclear: research and
benchmarks only, so they never enter the repository or a recipe); the sets are written under
`runs/` (ignored by git).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from nmt.config import DataConfig, load_config
from nmt.data.normalize import normalize_source, normalize_target
from nmt.data.passthrough import score_detector, shared_spans

Pair = tuple[str, str, set[str]]  # (zh, en, the span texts both hold)
MIRROR_LINES, MIRROR_WORDS_LINES, MIRROR_MAX_CHARS, NEWS_MAX_CHARS = 400, 200, 60, 40
PLAIN = (  # (folder, stem) of the mirror's plain .zh/.en corpora
    ("youdao-examples-zh-en", "coca"),
    ("youdao-examples-zh-en", "wordbooks"),
    ("aichallenger-zh-en", "valid"),
    ("aichallenger-zh-en", "train_sample"),
)


def jsonl_pairs(path: Path) -> Iterator[tuple[str, str]]:
    """(zh, en) of a Hugging Face translation-schema file."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)["translation"]
            yield row["zh"], row["en"]


def plain_pairs(folder: Path, stem: str) -> Iterator[tuple[str, str]]:
    """(zh, en) of a pair of line-aligned plain files, FOLDER/STEM.zh and .en."""
    zh = (folder / f"{stem}.zh").read_text(encoding="utf-8").splitlines()
    en = (folder / f"{stem}.en").read_text(encoding="utf-8").splitlines()
    yield from zip(zh, en, strict=True)


def with_spans(pairs: Iterator[tuple[str, str]], data: DataConfig, max_chars: int | None = None) -> list[Pair]:
    """The pairs (of at most `max_chars` Chinese characters) whose two sides share a span."""
    detector = score_detector(data)
    out = []
    for zh, en in pairs:
        if not zh.strip() or "\t" in zh or (max_chars and len(zh) > max_chars):
            continue
        shared = shared_spans(detector, normalize_source(zh, data), normalize_target(en, data))
        if shared:
            out.append((zh, en, shared))
    return out


def several_words(pair: Pair) -> bool:
    """Whether a pair's spans hold several words: one with a space, or two Latin ones."""
    return any(" " in s for s in pair[2]) or sum(s.isalpha() for s in pair[2]) >= 2


def write(out: Path, name: str, pairs: list[Pair]) -> None:
    for side, lang in enumerate(("zh", "en")):
        (out / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    print(f"{name:<13}{len(pairs):>5} lines {sum(len(p[2]) for p in pairs):>5} spans")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("runs/spans"))
    parser.add_argument("--config", default="configs/small.yaml", help="whose data settings normalise the text")
    args = parser.parse_args(argv)
    data = load_config(args.config).data
    args.out.mkdir(parents=True, exist_ok=True)
    tatoeba, news = args.mirror / "tatoeba-zh-en", args.mirror / "wmt-news-zh-en"
    write(args.out, "valid", with_spans(jsonl_pairs(tatoeba / "validation.jsonl"), data))
    write(args.out, "news40", with_spans(jsonl_pairs(news / "validation.jsonl"), data, NEWS_MAX_CHARS))
    mirror = []
    for folder, stem in PLAIN:
        mirror += with_spans(plain_pairs(args.mirror / folder, stem), data, MIRROR_MAX_CHARS)
    random.Random(0).shuffle(mirror)
    write(args.out, "mirror", mirror[:MIRROR_LINES])
    rest = [p for p in mirror[MIRROR_LINES:] if several_words(p)]
    write(args.out, "mirror-words", rest[:MIRROR_WORDS_LINES])
    write(args.out, "test", with_spans(jsonl_pairs(tatoeba / "test.jsonl"), data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

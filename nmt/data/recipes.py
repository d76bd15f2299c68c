"""Where each corpus lives (`Recipe`: a hub dataset and/or a mirror folder) and what one of its
records is (`pair_from_record`), with the count of unusable lines (`BadLines`).

The one module that both the file readers (`nmt.data.readers`) and the hub reader
(`nmt.data.hub`) import, so that neither imports the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nmt.config_values import suggest
from nmt.errors import NmtError, warn


@dataclass(frozen=True)
class HubSplit:
    """One of our splits as read from the hub: a hub split, whole or a hashed 1-in-`every` sample."""

    split: str  # hub split name: train | validation | test
    every: int = 0  # > 0: keep the rows whose target-side (English) hash % every == 0
    rest: bool = False  # with every: keep the other rows instead

    def keeps(self, target: str) -> bool:
        if self.every <= 0:
            return True
        digest = hashlib.blake2b(target.strip().encode("utf-8"), digest_size=8).digest()
        return (int.from_bytes(digest, "little") % self.every == 0) != self.rest


SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Recipe:
    """Where one corpus lives: a hub dataset (data files or its Parquet conversion) and/or a mirror folder."""

    name: str
    hub: str | None  # datasets hub path; None = mirror only
    config: str | None  # hub config name (datasets with data files per config)
    splits: tuple[tuple[str, HubSplit], ...]  # (our split, where it comes from on the hub)
    langs: tuple[str, str] = ("zh", "en")  # keys of the translation records
    subdir: str = ""  # mirror subdirectory holding the split files
    hub_kwargs: tuple[tuple[str, str], ...] = ()  # extra load_dataset keyword arguments
    revision: str | None = None  # hub revision: a commit, a tag or "refs/convert/parquet"
    data_dir: str = ""  # Parquet folder of one config: <data_dir>/<hub split>/*.parquet
    columns: tuple[tuple[str, str], ...] = ()  # flat tables: (language, column) instead of "translation"
    label: str = ""  # column with each row's language/script code (test labels become test.codes)
    keep: tuple[str, ...] = ()  # keep only the rows whose label is one of these
    # mirror file stems per split where they are not train / validation / test (`coca` for coca.zh + coca.en)
    stems: tuple[tuple[str, tuple[str, ...]], ...] = ()
    licence: str = "see the dataset's card"  # for the run's DATA.md and exported packages' metadata
    research_only: bool = False  # a licence that allows research and benchmarking only (or none stated)


_ALL = (("train", HubSplit("train")), ("valid", HubSplit("validation")), ("test", HubSplit("test")))
TATOEBA_VALID_EVERY = 18  # 1 in 18 Mandarin dev rows (about 2,000) validate; the rest train
MANDARIN = ("cmn_Hans", "cmn_Hant", "cmn")  # the rows of the eng-zho benchmark our mirror keeps
SCRAPED = "none stated: scraped from the Youdao dictionary; research and benchmarking only"
WMT = "WMT shared-task data, released for research use"
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "tatoeba",
            "Helsinki-NLP/tatoeba_mt",  # Tatoeba Challenge v2021-08-07, CC-BY 2.0 FR (see README, "Data")
            "eng-zho",
            (
                ("train", HubSplit("validation", every=TATOEBA_VALID_EVERY, rest=True)),
                ("valid", HubSplit("validation", every=TATOEBA_VALID_EVERY)),
                ("test", HubSplit("test")),
            ),
            subdir="tatoeba-zh-en",
            revision="refs/convert/parquet",
            data_dir="eng-zho",
            columns=(("en", "sourceString"), ("zh", "targetString")),
            label="targetlang",
            keep=MANDARIN,
            licence="CC-BY 2.0 FR (Tatoeba contributors)",
        ),
        Recipe("wmt19", "wmt/wmt19", "zh-en", _ALL[:2], subdir="wmt19-zh-en", licence=WMT),
        Recipe("wmt17", "wmt/wmt17", "zh-en", _ALL, subdir="wmt17-zh-en", licence=WMT),
        Recipe("opus100", "Helsinki-NLP/opus-100", "en-zh", _ALL, subdir="opus100-en-zh"),
        Recipe("iwslt2017", "IWSLT/iwslt2017", "iwslt2017-zh-en", _ALL, subdir="iwslt2017-zh-en"),
        Recipe("news_commentary", "Helsinki-NLP/news_commentary", "en-zh", _ALL[:1], subdir="news-commentary-en-zh"),
        Recipe("wmt_news", None, None, (), subdir="wmt-news-zh-en", licence=WMT),
        # Mirror-only corpora of plain .zh/.en pairs (shared/data's README, "More training data")
        Recipe(
            "youdao_coca",
            None,
            None,
            (),
            subdir="youdao-examples-zh-en",
            stems=(("train", ("coca",)),),
            licence=SCRAPED,
            research_only=True,
        ),
        Recipe(
            "youdao_wordbooks",
            None,
            None,
            (),
            subdir="youdao-examples-zh-en",
            stems=(("train", ("wordbooks",)),),
            licence=SCRAPED,
            research_only=True,
        ),
        Recipe(
            "aichallenger",
            None,
            None,
            (),
            subdir="aichallenger-zh-en",
            stems=(("train", ("train_sample",)), ("valid", ("valid",))),
            licence="AI Challenger 2017 terms: research, non-commercial",
            research_only=True,
        ),
    )
}


def get_recipe(name: str, key: str = "data.corpus") -> Recipe:
    """The recipe called `name`; NmtError naming the config `key` and the nearest name otherwise."""
    if name not in RECIPES:
        hint = suggest(name, RECIPES)
        raise NmtError(f"{key}: unknown corpus {name!r}{hint}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


class BadLines:
    """Counts skipped lines of one file by reason, with each reason's first line number (and, for
    test, every skipped line number: its codes file must skip the same lines)."""

    def __init__(self, label: str, keep_lines: bool = False) -> None:
        self.label, self.keep_lines = label, keep_lines
        self.count, self.first, self.reason = 0, 0, ""
        self.lines: set[int] = set()
        self.reasons: dict[str, list[int]] = {}  # reason -> [count, first line]

    def add(self, lineno: int, reason: str, count: int = 1) -> None:
        """Count `count` bad lines of one reason, the first of them at `lineno`."""
        if not self.count or lineno < self.first:
            self.first, self.reason = lineno, reason
        self.count += count
        tally = self.reasons.setdefault(reason, [0, lineno])
        tally[0] += count
        tally[1] = min(tally[1], lineno)
        if self.keep_lines:
            self.lines.add(lineno)

    def merge(self, reasons: dict[str, list[int]], offset: int) -> None:
        """Add another count by reason (`reasons` as in `self.reasons`) whose line numbers start after `offset`."""
        for reason, (count, first) in reasons.items():
            self.add(first + offset, reason, count)

    def summary(self) -> dict[str, dict[str, int]]:
        """{reason: {"count": n, "first_line": k}}, for stats.json."""
        return {r: {"count": n, "first_line": first} for r, (n, first) in sorted(self.reasons.items())}

    def warn(self) -> None:
        """One warning: the first bad line and the total, then each reason's count and first line."""
        if self.count:
            plural = "s" if self.count > 1 else ""
            msg = f"{self.label}:{self.first}: {self.reason} (skipped {self.count} bad line{plural})"
            if len(self.reasons) > 1:
                msg += "; " + ", ".join(f"{n} {r} (first line {k})" for r, (n, k) in sorted(self.reasons.items()))
            warn(msg)


def pair_from_record(obj: object, src: str, tgt: str) -> tuple[str, str] | str:
    """(src, tgt) from a translation record, or the reason it is unusable."""
    rec = obj.get("translation", obj) if isinstance(obj, dict) else None
    if not isinstance(rec, dict):
        return "not a translation record"
    for key in (src, tgt):
        if not isinstance(rec.get(key), str):
            return f"record missing {key!r}"
    return rec[src], rec[tgt]

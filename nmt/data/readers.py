"""Readers for corpus splits: JSONL / TSV / plain parallel files, each optionally gzip- or
xz-compressed (`train.jsonl.gz`, `train.zh.xz` + `train.en.xz`), or the hub (`nmt.data.hub`).

A reader streams `(line number, source text, target text)` for the usable records of one
split and counts the unusable ones by reason in a `BadLines`, which warns once per file naming
the first bad line: invalid UTF-8, a NUL byte, a line longer than `MAX_LINE_BYTES`, invalid
JSON, a record without the language keys, a TSV line without a TAB, a blank JSONL/TSV line.
Nothing is loaded into memory whole. Plain parallel files whose line counts differ stop with
one line naming both files and both counts, before anything is read.

`parse_lines` and `parse_plain` are the per-line rules; `nmt.data.units` applies the same
rules to a part of a file.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import itertools
import json
import lzma
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nmt.config import DataConfig
from nmt.data.hub import hub_pairs, read_hub
from nmt.data.hub_cache import parquet_rows, split_files
from nmt.data.recipes import SPLITS, BadLines, HubSplit, Recipe, pair_from_record
from nmt.errors import NmtError

MAX_LINE_BYTES = 1 << 20  # a longer line is a bad line: no sentence pair is that long (max_chars is far below)
COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}  # by file suffix; anything else is read as it is
_MIRROR_STEMS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


@dataclass(frozen=True)
class Source:
    kind: str  # jsonl | tsv | plain | hub | none
    paths: tuple[Path, ...] = ()  # hub: its Parquet files in the hub cache (none: streamed)
    label: str = ""
    hub_split: HubSplit | None = None
    ref: str = ""  # hub with files: the repository, commit and paths they are (`HubFiles.ref`)


def _parse_json(text: str, src: str, tgt: str) -> tuple[str, str] | str:
    try:
        return pair_from_record(json.loads(text), src, tgt)
    except json.JSONDecodeError:
        return "invalid JSON"


def _parse_tsv(text: str, src: str, tgt: str) -> tuple[str, str] | str:
    """source<TAB>target; further columns (e.g. attribution) are ignored."""
    fields = text.rstrip("\r\n").split("\t")
    return (fields[0], fields[1]) if len(fields) >= 2 else "expected source<TAB>target"


def open_binary(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when its suffix is .gz or .xz."""
    opener = COMPRESSED.get(Path(path).suffix)
    return opener(path, "rb") if opener else open(path, "rb")  # type: ignore[return-value]


def bounded_lines(f: BinaryIO) -> Iterator[bytes]:
    """The lines of an open file, none held longer than MAX_LINE_BYTES + 1 bytes: of a longer
    line (a file without line breaks, say) only its start is yielded, which `decode_line`
    rejects, and the rest is read past in pieces."""
    while raw := f.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
        yield raw


def is_compressed(path: Path) -> bool:
    return Path(path).suffix in COMPRESSED


def decode_line(raw: bytes, first: bool) -> tuple[str | None, str]:
    """(text without its line break, "") of one raw line, or (None, why it is unusable);
    `first`: the file's first line (which may start with a byte-order mark)."""
    if len(raw) > MAX_LINE_BYTES:
        return None, f"line longer than {MAX_LINE_BYTES >> 20} MiB"
    if b"\0" in raw:
        return None, "NUL byte"
    if first and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        return raw.decode("utf-8").rstrip("\r\n"), ""
    except UnicodeDecodeError:
        return None, "invalid UTF-8"


def parse_lines(
    lines: Iterable[bytes], parse: Callable, data: DataConfig, bad: BadLines, at_start: bool = True
) -> Iterator[tuple[int, str, str]]:
    """(line number, source, target) of the usable JSONL/TSV lines (`parse`: `PARSERS[kind]`),
    numbered from 1; the others counted in `bad`. `at_start`: the lines begin the file (a
    byte-order mark is dropped from the first one, as Windows editors write one)."""
    src, tgt = data.src_lang, data.tgt_lang
    for n, raw in enumerate(lines, 1):
        text, reason = decode_line(raw, at_start and n == 1)
        if text is not None:
            pair = parse(text, src, tgt) if text and not text.isspace() else "blank line"
            if not isinstance(pair, str) and ("\0" in pair[0] or "\0" in pair[1]):
                pair = "NUL byte"  # written as \u0000 in JSON
            if not isinstance(pair, str):
                yield n, pair[0], pair[1]
                continue
            reason = pair
        bad.add(n, reason)


def parse_plain(
    lines: Iterable[tuple[bytes, bytes]], bad: BadLines, at_start: bool = True
) -> Iterator[tuple[int, str, str]]:
    """(line number, source, target) of aligned plain lines, numbered from 1; a pair with one
    unusable side is counted in `bad`. `at_start` as in `parse_lines`."""
    for n, (rs, rt) in enumerate(lines, 1):
        s, why_s = decode_line(rs, at_start and n == 1)
        t, why_t = decode_line(rt, at_start and n == 1)
        if s is None or t is None:
            bad.add(n, why_s or why_t)
        else:
            yield n, s, t


def count_lines(path: Path) -> int:
    n, last = 0, b"\n"
    with open_binary(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def check_aligned(src_path: Path, tgt_path: Path) -> int:
    """The line count of two plain parallel files; NmtError naming both files and counts if they differ."""
    a, b = count_lines(src_path), count_lines(tgt_path)
    if a != b:
        raise NmtError(f"{src_path} has {a} lines but {tgt_path} has {b}: parallel files must align")
    return a


def _read_plain(src_path: Path, tgt_path: Path, bad: BadLines) -> Iterator[tuple[int, str, str]]:
    check_aligned(src_path, tgt_path)
    with open_binary(src_path) as fs, open_binary(tgt_path) as ft:
        yield from parse_plain(zip(bounded_lines(fs), bounded_lines(ft), strict=True), bad)


def _read_lines(path: Path, parse: Callable, data: DataConfig, bad: BadLines) -> Iterator[tuple[int, str, str]]:
    with open_binary(path) as f:  # bytes: a bad line is skipped, not fatal; only b"\n" ends a line
        yield from parse_lines(bounded_lines(f), parse, data, bad)


PARSERS: dict[str, Callable] = {"jsonl": _parse_json, "tsv": _parse_tsv}


def read_split(
    source: Source, recipe: Recipe, data: DataConfig, bad: BadLines, labels: list[str] | None = None
) -> Iterator[tuple[int, str, str]]:
    """Stream (line number, source text, target text) of the usable records of one split.

    For a hub split with a label column, each yielded row's label is appended to `labels`."""
    if source.kind in ("jsonl", "tsv"):
        return _read_lines(source.paths[0], PARSERS[source.kind], data, bad)
    if source.kind == "plain":
        return _read_plain(source.paths[0], source.paths[1], bad)
    if source.kind == "hub" and source.hub_split is not None:
        langs = (data.src_lang, data.tgt_lang)
        if source.paths:  # the cached Parquet files
            rows = itertools.chain.from_iterable(map(parquet_rows, source.paths))
            return hub_pairs(rows, recipe, source.hub_split, langs, bad, labels)
        return read_hub(recipe, source.hub_split, langs, bad, labels)
    return iter(())


def cached_hub(source: Source, recipe: Recipe) -> Source:
    """A hub split with its Parquet files downloaded once into the hub cache (`nmt.data.hub_cache`):
    read from there; other sources, and hub splits that are not Parquet files, as they are."""
    if source.kind != "hub" or source.hub_split is None or source.paths:
        return source
    files = split_files(recipe, source.hub_split)
    if files is None:
        return source
    return dataclasses.replace(source, paths=files.local, ref=files.ref)


def _mirror_root(data: DataConfig, mirror: str | None) -> Path | None:
    candidates = (("--mirror", mirror), ("data.mirror", data.mirror), ("NMT_MIRROR", os.environ.get("NMT_MIRROR")))
    for origin, value in candidates:
        if value:
            root = Path(value).expanduser()
            if not root.is_dir():
                raise NmtError(f"{root}: mirror directory not found (from {origin})")
            return root
    return None


def _mirror_split(folder: Path, split: str, data: DataConfig, stems: tuple[str, ...] = ()) -> Source:
    """The file of `split` in a mirror folder: the first of `stems` (default `_MIRROR_STEMS`) that
    exists as .jsonl, .tsv or a plain .zh + .en pair, each maybe compressed; kind "none" if none does."""
    for stem in stems or _MIRROR_STEMS[split]:
        for ext in ("", *COMPRESSED):
            for kind in ("jsonl", "tsv"):
                if (folder / f"{stem}.{kind}{ext}").is_file():
                    return Source(kind, (folder / f"{stem}.{kind}{ext}",), str(folder / f"{stem}.{kind}{ext}"))
            pair = (folder / f"{stem}.{data.src_lang}{ext}", folder / f"{stem}.{data.tgt_lang}{ext}")
            if pair[0].is_file() != pair[1].is_file():
                have, missing = pair if pair[0].is_file() else pair[::-1]
                raise NmtError(f"{missing}: not found, but {have.name} is there (plain files come in pairs)")
            if pair[0].is_file():
                return Source("plain", pair, f"{pair[0]}+{pair[1].name if ext else pair[1].suffix}")
    return Source("none", label=str(folder / f"{split}.jsonl"))


def path_source(path: str | Path, data: DataConfig, split: str, key: str) -> Source:
    """The split named by a path of the config (`key`, for errors): a folder laid out like a
    mirror folder (its `split` files), or one file: `x.jsonl` or `x.tsv` (each maybe .gz/.xz), or
    one side of a plain pair (`x.zh`, its partner `x.en` beside it)."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = _mirror_split(p, split, data)
        if found.kind == "none":
            raise NmtError(f"{key}: {p} has no {split} file ({split}.jsonl, {split}.tsv or {split}.zh + {split}.en)")
        return found
    if not p.is_file():
        raise NmtError(f"{key}: {p} not found")
    stem = p.with_suffix("") if is_compressed(p) else p
    kind = stem.suffix.lstrip(".")
    if kind in PARSERS:
        return Source(kind, (p,), str(p))
    langs = (data.src_lang, data.tgt_lang)
    if kind not in langs:
        raise NmtError(f"{key}: {p}: expected .jsonl, .tsv or .{langs[0]} / .{langs[1]} (each maybe .gz or .xz)")
    ext = p.suffix if is_compressed(p) else ""
    pair = tuple(stem.with_suffix(f".{lang}{ext}") for lang in langs)
    if not pair[0].is_file() or not pair[1].is_file():
        missing = pair[0] if not pair[0].is_file() else pair[1]
        raise NmtError(f"{key}: {missing} not found, but {p.name} is there (plain files come in pairs)")
    return Source("plain", pair, f"{pair[0]}+{pair[1].name if ext else pair[1].suffix}")


def find_sources(
    recipe: Recipe,
    data: DataConfig,
    mirror: str | None = None,
    need: tuple[str, ...] = ("train", "valid"),
    key: str = "data.corpus",
    own_folder: bool = False,
) -> dict[str, Source]:
    """Where each split comes from: the mirror (argument, data.mirror, NMT_MIRROR) or the hub;
    `data.valid` / `data.test` when set. NmtError (naming `key`) when a split of `need` is missing.
    A mirror's folder of the recipe (`recipe.subdir`) is read, or its top folder when it has none
    there, unless `own_folder` (one of several corpora: the top folder is not this one's)."""
    root = _mirror_root(data, mirror)
    if root is not None and own_folder and recipe.subdir and not (root / recipe.subdir).is_dir():
        raise NmtError(
            f"{key}: {recipe.name!r}: the mirror {root} has no folder {recipe.subdir} "
            "(point --mirror or NMT_MIRROR at a mirror that has it)"
        )
    if root is not None:
        folder = root / recipe.subdir if recipe.subdir and (root / recipe.subdir).is_dir() else root
        stems = dict(recipe.stems)
        sources = {split: _mirror_split(folder, split, data, stems.get(split, ())) for split in SPLITS}
        train = stems.get("train", ("train",))[0]
        where = (
            f"mirror {folder} (looked for {train}.jsonl, {train}.tsv, {train}.{data.src_lang}+{train}.{data.tgt_lang})"
        )
    elif recipe.hub is None:
        where = f"folder {recipe.subdir} of a mirror" if recipe.subdir else "a mirror"
        raise NmtError(f"{key}: {recipe.name!r} is read from {where}: pass --mirror DIR or set NMT_MIRROR")
    else:
        hub = dict(recipe.splits)
        sources = {
            s: Source("hub", label=f"hub {recipe.hub}:{hub[s].split}", hub_split=hub[s]) if s in hub else Source("none")
            for s in SPLITS
        }
        where = f"hub {recipe.hub}"
    for split, path in (("valid", data.valid), ("test", data.test)):
        if path is not None:  # named in the config: wins over the corpus's own split
            sources[split] = path_source(path, data, split, f"data.{split}")
    if "train" in need and sources["train"].kind == "none":
        raise NmtError(f"corpus {recipe.name!r} has no train split in {where}; it can only be used for evaluation")
    if "valid" in need and sources["valid"].kind == "none":
        raise NmtError(f"corpus {recipe.name!r} has no validation split in {where}")
    return sources

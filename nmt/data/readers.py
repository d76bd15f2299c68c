"""Readers for corpus splits: JSONL / TSV / plain parallel files, or the hub (`nmt.data.hub`).

A reader streams `(line number, source text, target text)` for the usable records of one
split and counts the unusable ones (invalid UTF-8, invalid JSON, a record without the
language keys, a TSV line without a TAB, a blank line) in a `BadLines`, which warns once per
file naming the first bad line. Nothing is loaded into memory whole.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.config import DataConfig
from nmt.data.hub import read_hub
from nmt.data.recipes import SPLITS, BadLines, HubSplit, Recipe, pair_from_record
from nmt.errors import NmtError

_MIRROR_STEMS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


@dataclass(frozen=True)
class Source:
    kind: str  # jsonl | tsv | plain | hub | none
    paths: tuple[Path, ...] = ()
    label: str = ""
    hub_split: HubSplit | None = None


def _parse_json(text: str, src: str, tgt: str) -> tuple[str, str] | str:
    try:
        return pair_from_record(json.loads(text), src, tgt)
    except json.JSONDecodeError:
        return "invalid JSON"


def _parse_tsv(text: str, src: str, tgt: str) -> tuple[str, str] | str:
    """source<TAB>target; further columns (e.g. attribution) are ignored."""
    fields = text.rstrip("\r\n").split("\t")
    return (fields[0], fields[1]) if len(fields) >= 2 else "expected source<TAB>target"


def _no_bom(raw: bytes, lineno: int) -> bytes:
    """The first line without a UTF-8 byte-order mark (Windows editors write one)."""
    return raw[len(codecs.BOM_UTF8) :] if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else raw


def _read_lines(path: Path, parse: Callable, data: DataConfig, bad: BadLines) -> Iterator[tuple[int, str, str]]:
    with open(path, "rb") as f:  # bytes: a bad line is skipped, not fatal; only b"\n" ends a line
        for n, raw in enumerate(f, 1):
            try:
                text = _no_bom(raw, n).decode("utf-8")
            except UnicodeDecodeError:
                bad.add(n, "invalid UTF-8")
                continue
            pair = parse(text, data.src_lang, data.tgt_lang) if text.strip() else "blank line"
            if isinstance(pair, str):
                bad.add(n, pair)
                continue
            yield n, pair[0], pair[1]


def count_lines(path: Path) -> int:
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _read_plain(src_path: Path, tgt_path: Path, bad: BadLines) -> Iterator[tuple[int, str, str]]:
    a, b = count_lines(src_path), count_lines(tgt_path)
    if a != b:
        raise NmtError(f"{src_path} has {a} lines but {tgt_path} has {b}: parallel files must align")
    with open(src_path, "rb") as fs, open(tgt_path, "rb") as ft:
        for n, (rs, rt) in enumerate(zip(fs, ft, strict=True), 1):
            try:
                yield n, _no_bom(rs, n).decode("utf-8").rstrip("\r\n"), _no_bom(rt, n).decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                bad.add(n, "invalid UTF-8")


def read_split(
    source: Source, recipe: Recipe, data: DataConfig, bad: BadLines, labels: list[str] | None = None
) -> Iterator[tuple[int, str, str]]:
    """Stream (line number, source text, target text) of the usable records of one split.

    For a hub split with a label column, each yielded row's label is appended to `labels`."""
    if source.kind in ("jsonl", "tsv"):
        return _read_lines(source.paths[0], _parse_json if source.kind == "jsonl" else _parse_tsv, data, bad)
    if source.kind == "plain":
        return _read_plain(source.paths[0], source.paths[1], bad)
    if source.kind == "hub" and source.hub_split is not None:
        return read_hub(recipe, source.hub_split, (data.src_lang, data.tgt_lang), bad, labels)
    return iter(())


def _mirror_root(data: DataConfig, mirror: str | None) -> Path | None:
    candidates = (("--mirror", mirror), ("data.mirror", data.mirror), ("NMT_MIRROR", os.environ.get("NMT_MIRROR")))
    for origin, value in candidates:
        if value:
            root = Path(value).expanduser()
            if not root.is_dir():
                raise NmtError(f"{root}: mirror directory not found (from {origin})")
            return root
    return None


def _mirror_split(folder: Path, split: str, data: DataConfig) -> Source:
    for stem in _MIRROR_STEMS[split]:
        for kind in ("jsonl", "tsv"):
            if (folder / f"{stem}.{kind}").is_file():
                return Source(kind, (folder / f"{stem}.{kind}",), str(folder / f"{stem}.{kind}"))
        pair = (folder / f"{stem}.{data.src_lang}", folder / f"{stem}.{data.tgt_lang}")
        if pair[0].is_file() != pair[1].is_file():
            have, missing = pair if pair[0].is_file() else pair[::-1]
            raise NmtError(f"{missing}: not found, but {have.name} is there (plain files come in pairs)")
        if pair[0].is_file():
            return Source("plain", pair, f"{pair[0]}+{pair[1].suffix}")
    return Source("none", label=str(folder / f"{split}.jsonl"))


def find_sources(recipe: Recipe, data: DataConfig, mirror: str | None = None) -> dict[str, Source]:
    """Where each split comes from: the mirror (argument, data.mirror, NMT_MIRROR) or the hub."""
    root = _mirror_root(data, mirror)
    if root is not None:
        folder = root / recipe.subdir if recipe.subdir and (root / recipe.subdir).is_dir() else root
        sources = {split: _mirror_split(folder, split, data) for split in SPLITS}
        where = f"mirror {folder} (looked for train.jsonl, train.tsv, train.{data.src_lang}+train.{data.tgt_lang})"
    elif recipe.hub is None:
        raise NmtError(f"data.corpus: {recipe.name!r} is mirror-only: pass --mirror DIR, set data.mirror or NMT_MIRROR")
    else:
        hub = dict(recipe.splits)
        sources = {
            s: Source("hub", label=f"hub {recipe.hub}:{hub[s].split}", hub_split=hub[s]) if s in hub else Source("none")
            for s in SPLITS
        }
        where = f"hub {recipe.hub}"
    if sources["train"].kind == "none":
        raise NmtError(f"corpus {recipe.name!r} has no train split in {where}; it can only be used for evaluation")
    if sources["valid"].kind == "none":
        raise NmtError(f"corpus {recipe.name!r} has no validation split in {where}")
    return sources

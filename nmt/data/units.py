"""A split cut into units: parts fixed by the input alone, never by the number of workers, so
that cleaning them on 1 or N processes and writing the results in unit order gives the same bytes.

- uncompressed JSONL/TSV: line-aligned byte ranges of about `UNIT_BYTES` (each boundary moved
  to the start of the next line); a worker reads its range itself.
- uncompressed plain pairs: blocks of `UNIT_LINES` lines, with each block's byte offset in both
  files, found in the pass that counts the lines (which stops on differing counts, before any
  other work).
- the hub's Parquet files, downloaded once (`nmt.data.hub_cache`): whole row groups of one file,
  consecutive ones joined up to `UNIT_LINES` rows, planned from the files' footers; a worker
  reads its row groups itself.
- compressed files (gzip, xz) and a streamed hub split (not Parquet): blocks of `UNIT_LINES`
  lines (rows) read in order by the parent and handed to a worker whole.

A worker turns its unit back into records with `unit_records`: (line number within the unit,
source, target), bad lines counted by reason with their line number within the unit; the
parent adds the lines of the earlier units (`Cleaned.lines`) to report file line numbers.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nmt.config import DataConfig
from nmt.data.hub import hub_pairs
from nmt.data.hub_cache import parquet_rows, row_group_units
from nmt.data.readers import (
    PARSERS,
    Source,
    bounded_lines,
    check_aligned,
    is_compressed,
    open_binary,
    parse_lines,
    parse_plain,
    read_split,
)
from nmt.data.recipes import BadLines, HubSplit, Recipe

UNIT_BYTES = 16 << 20  # a JSONL/TSV unit: about 100k WMT-length pairs
UNIT_LINES = 100_000  # a plain, compressed or hub unit


@dataclass(frozen=True)
class Unit:
    """One unit of a split: a part of its file(s) (`paths`, `starts`, `size`) or its records (`rows`)."""

    index: int
    kind: str  # jsonl | tsv | plain: the format of the lines; pairs: hub rows already read; parquet: row groups
    paths: tuple[Path, ...] = ()  # file units: the file (jsonl, tsv, parquet) or the two files (plain)
    starts: tuple[int, ...] = ()  # file units: byte offset of the first line in each path (parquet: first row group)
    size: int = 0  # file units: bytes (jsonl, tsv), lines (plain) or row groups (parquet)
    rows: tuple = ()  # in-memory units: raw lines (jsonl, tsv), (src, tgt) raw lines (plain), (n, s, t) (pairs)
    recipe: Recipe | None = None  # parquet: the recipe and hub split its rows are read by (`hub_pairs`)
    hub_split: HubSplit | None = None

    @property
    def at_start(self) -> bool:
        """Whether the unit begins its file (whose first line may carry a byte-order mark)."""
        return self.index == 0


def plan_units(source: Source, recipe: Recipe, data: DataConfig, bad: BadLines) -> tuple[int | None, Iterator[Unit]]:
    """(number of units if known before reading, the units in order) of one split. Streamed hub
    rows are read here, their bad rows counted in `bad`. Plain files whose line counts differ are
    an NmtError naming both: before the first unit when uncompressed (their lines are counted to
    plan the units), when one ends first otherwise."""
    if source.kind == "hub" and source.paths:  # cached Parquet files: whole row groups, read by the workers
        groups = row_group_units(source.paths, UNIT_LINES)
        units = [
            Unit(i, "parquet", (path,), (first,), count, recipe=recipe, hub_split=source.hub_split)
            for i, (path, first, count) in enumerate(groups)
        ]
        return len(units), iter(units)
    if source.kind == "hub":
        rows = read_split(source, recipe, data, bad)
        return None, (Unit(i, "pairs", rows=block) for i, block in enumerate(_blocks(rows)))
    if source.kind == "plain":
        if any(map(is_compressed, source.paths)):
            return None, _streamed(source)
        starts = _plain_starts(*source.paths)
        units = [Unit(i, "plain", source.paths, s, UNIT_LINES) for i, s in enumerate(starts)]
        return len(units), iter(units)
    if is_compressed(source.paths[0]):
        return None, _streamed(source)
    ranges = _byte_ranges(source.paths[0])
    units = [Unit(i, source.kind, source.paths, (a,), b - a) for i, (a, b) in enumerate(ranges)]
    return len(units), iter(units)


def _blocks(items: Iterator) -> Iterator[tuple]:
    while block := tuple(itertools.islice(items, UNIT_LINES)):
        yield block


def _streamed(source: Source) -> Iterator[Unit]:
    """Blocks of raw lines of compressed files, read in order."""
    files = [open_binary(p) for p in source.paths]
    try:
        lines = zip(*map(bounded_lines, files), strict=True) if source.kind == "plain" else bounded_lines(files[0])
        for i, block in enumerate(_blocks(iter(lines))):
            yield Unit(i, source.kind, rows=block)
    except ValueError:  # zip: one file ended first (prepare_corpus checks the counts before reading)
        check_aligned(*source.paths)
        raise
    finally:
        for f in files:
            f.close()


def _byte_ranges(path: Path) -> list[tuple[int, int]]:
    """[start, end) byte ranges of about UNIT_BYTES each, every one starting at a line start."""
    size = path.stat().st_size
    starts = [0]
    with open(path, "rb") as f:
        while starts[-1] + UNIT_BYTES < size:
            f.seek(starts[-1] + UNIT_BYTES - 1)  # from the byte before: a line may start right there
            while (part := f.readline(1 << 20)) and not part.endswith(b"\n"):
                pass  # a long line is passed in pieces, never held whole
            if f.tell() >= size:
                break
            starts.append(f.tell())
    return list(zip(starts, [*starts[1:], size], strict=True))


def _line_starts(path: Path, every: int) -> tuple[int, list[int]]:
    """(number of lines, byte offsets of lines 0, every, 2*every, ... that exist) of one file."""
    starts, n, pos, last = [0], 0, 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            found = chunk.count(b"\n")
            at = -1
            while n + found >= len(starts) * every:  # a block boundary falls inside this chunk
                need = len(starts) * every - n  # newlines to pass before the next block starts
                for _ in range(need):
                    at = chunk.find(b"\n", at + 1)
                n, found = n + need, found - need
                starts.append(pos + at + 1)
            n += found
            pos, last = pos + len(chunk), chunk[-1:]
    lines = n + (last != b"\n")
    return lines, [s for s in starts if s < pos]


def _plain_starts(src: Path, tgt: Path) -> list[tuple[int, int]]:
    """Byte offsets of each UNIT_LINES block in both plain files; NmtError if their line counts differ."""
    (a, sa), (b, sb) = _line_starts(src, UNIT_LINES), _line_starts(tgt, UNIT_LINES)
    if a != b:
        check_aligned(src, tgt)  # the one message naming both files and counts
    return list(zip(sa, sb, strict=True))


def unit_records(unit: Unit, data: DataConfig, bad: BadLines, lines: list[int]) -> Iterator[tuple[int, str, str]]:
    """(line number within the unit, source, target) of the usable records of one unit; bad
    lines counted in `bad` (numbered within the unit); `lines[0]` ends as the unit's line count."""
    if unit.kind == "pairs":
        lines[0] = len(unit.rows)
        yield from unit.rows
        return
    if unit.kind == "parquet" and unit.recipe is not None and unit.hub_split is not None:
        rows = _count(parquet_rows(unit.paths[0], unit.starts[0], unit.size), lines)
        yield from hub_pairs(rows, unit.recipe, unit.hub_split, (data.src_lang, data.tgt_lang), bad)
        return
    with _unit_lines(unit) as raw:
        counted = _count(raw, lines)
        if unit.kind == "plain":
            yield from parse_plain(counted, bad, unit.at_start)
        else:
            yield from parse_lines(counted, PARSERS[unit.kind], data, bad, unit.at_start)


def _count(items: Iterator, lines: list[int]) -> Iterator:
    for item in items:
        lines[0] += 1
        yield item


@contextlib.contextmanager
def _unit_lines(unit: Unit) -> Iterator[Iterator]:
    """The raw lines of a unit: its rows, or its part of its file(s), opened for the while."""
    if unit.rows or not unit.paths:
        yield iter(unit.rows)
        return
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "rb")) for p in unit.paths]
        for f, start in zip(files, unit.starts, strict=True):
            f.seek(start)
        # plain: the counts were checked equal when the units were planned
        yield (
            itertools.islice(zip(*map(bounded_lines, files), strict=False), unit.size)
            if unit.kind == "plain"
            else _range(files[0], unit.size)
        )


def _range(f: BinaryIO, size: int) -> Iterator[bytes]:
    """The lines of an open file from where it stands, `size` bytes of them."""
    end = f.tell() + size
    if size > 0:
        for raw in bounded_lines(f):
            yield raw
            if f.tell() >= end:
                break

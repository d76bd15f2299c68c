"""Cleaning a split on all cores: each unit (`nmt.data.units`) normalised and filtered in a
worker process, its kept pairs written to a work folder, the results taken in unit order.

Rules, in order (the first that applies names the drop):
- `empty`: a side empty after normalisation;
- `too_long`: a side longer than `data.max_chars` characters;
- `markup`: a side that is only URLs, e-mail addresses, tags or entities, or holds scraping residue;
- `ratio`: a length ratio above the corpus's `filters.max_ratio`, else `data.max_ratio`;
- `identical`: both sides the same text but for case, spaces and punctuation;
- `script`: a side whose own script is less than `filters.script` of its letters;
- `overlap`: a side equal to a valid/test side after normalisation (`Held`).
`markup`, `identical` and `script` are the noise filters of `data.filters` (or the corpus's own
`data.corpora[i].filters`), off by default (`nmt.data.noise`). Duplicates (and near-duplicates,
`filters.near_dup`) and the `max_train_pairs` sample are decided afterwards over all units
(`nmt.data.dedup`, `nmt.data.subset`), from the pair hashes written here.

Length ratio: a Chinese side counts its non-space characters, any other side its characters
divided by `LATIN_CHARS_PER_HANZI` (= 3, the median en/zh character ratio of Tatoeba and WMT
news is 3.1-3.7), so balanced pairs score about 1 whichever side is longer; ratio = longer /
shorter, each length at least 1.

A side whose raw text has more than `GUARD` × `max_chars` non-space characters is `too_long`
without being normalised (a 1 MiB line never reaches OpenCC): NFKC composes at most four code
points into one and Traditional→Simplified never shortens, so it would be too long after them.

Work folder, per unit `uNNNNNN`: `.src`, `.tgt` (kept pairs, one per line), `.keys.npy` (uint64
pair hashes, `text_hash`), with `filters.near_dup` `.near.npy` (the pairs' `nmt.data.noise.near_hash`)
and `.json` (its counts), each written atomically, the `.json` last:
a unit with a `.json` is done, so a run killed midway continues at the first unit without one.
`manifest.json` holds the digest of the inputs and settings; another digest empties the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from nmt.config import DataConfig
from nmt.data.noise import markup, near_hash, near_key, script_share
from nmt.data.normalize import normalize_text
from nmt.data.pool import map_ordered
from nmt.data.readers import Source
from nmt.data.recipes import BadLines, Recipe
from nmt.data.units import Unit, plan_units, unit_records
from nmt.files import atomic_path, atomic_write_json

RULES = ("empty", "too_long", "markup", "ratio", "identical", "script", "overlap")
LATIN_CHARS_PER_HANZI = 3.0
GUARD = 8


def _scaled_len(text: str, chinese: bool) -> float:
    if chinese:
        return float(len(text) - text.count(" "))
    return len(text) / LATIN_CHARS_PER_HANZI


def length_ratio(src: str, tgt: str, data: DataConfig) -> float:
    a = max(_scaled_len(src, data.src_lang.startswith("zh")), 1.0)
    b = max(_scaled_len(tgt, data.tgt_lang.startswith("zh")), 1.0)
    return max(a, b) / min(a, b)


def text_hash(text: str) -> int:
    """64-bit blake2b of the UTF-8 text: a pair's key for dedup (of source TAB target)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Held:
    """The overlap guard: the normalised sources and targets of valid and test (small sets)."""

    src: frozenset[str] = frozenset()
    tgt: frozenset[str] = frozenset()


def _huge(text: str, limit: int) -> bool:
    """More than GUARD × limit non-space characters (the length test first: it is free)."""
    return len(text) > GUARD * limit and sum(map(len, text.split())) > GUARD * limit


class Rules:
    """The cleaning rules of one config, its settings looked up once (a pair costs microseconds)."""

    def __init__(self, data: DataConfig, held: Held) -> None:
        self.data, self.held, self.limit, self.filters = data, held, data.max_chars, data.filters
        self.ratio = data.max_ratio if data.filters.max_ratio is None else data.filters.max_ratio
        self.zh = (data.src_lang.startswith("zh"), data.tgt_lang.startswith("zh"))

    def __call__(self, src: str, tgt: str) -> tuple[str | None, str, str]:
        """(the rule that drops the pair or None, normalised source, normalised target)."""
        if _huge(src, self.limit) or _huge(tgt, self.limit):
            return "too_long", src, tgt
        s, t = normalize_text(src, self.data, self.zh[0]), normalize_text(tgt, self.data, self.zh[1])
        if not s or not t:
            return "empty", s, t
        if len(s) > self.limit or len(t) > self.limit:
            return "too_long", s, t
        f = self.filters
        if f.markup and (markup(s) or markup(t)):
            return "markup", s, t
        a, b = max(_scaled_len(s, self.zh[0]), 1.0), max(_scaled_len(t, self.zh[1]), 1.0)
        if (a / b if a > b else b / a) > self.ratio:
            return "ratio", s, t
        if f.identical and near_key(s) == near_key(t):
            return "identical", s, t
        if f.script and any(
            (share := script_share(text, zh)) is not None and share < f.script
            for text, zh in ((s, self.zh[0]), (t, self.zh[1]))
        ):
            return "script", s, t
        if s in self.held.src or t in self.held.tgt:
            return "overlap", s, t
        return None, s, t


# --------------------------------------------------------------------------- one unit, in a worker

_WORKER: dict = {}


def _init_worker(data: DataConfig, held: Held, folder: Path) -> None:
    _WORKER.update(data=data, rules=Rules(data, held), folder=folder)


def unit_path(folder: Path, index: int, suffix: str) -> Path:
    return folder / f"u{index:06d}{suffix}"


def clean_unit(unit: Unit) -> dict:
    """Clean one unit into the work folder, unless a previous run did; its counts: lines, kept,
    dropped by rule, bad lines by reason ([count, first line within the unit])."""
    data, rules, folder = _WORKER["data"], _WORKER["rules"], _WORKER["folder"]
    done = unit_path(folder, unit.index, ".json")
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    bad, lines, keys, near = BadLines(""), [0], [], []
    near_dup = data.filters.near_dup
    dropped = dict.fromkeys(RULES, 0)
    src, tgt = unit_path(folder, unit.index, ".src"), unit_path(folder, unit.index, ".tgt")
    with atomic_path(src) as ps, atomic_path(tgt) as pt:
        with open(ps, "w", encoding="utf-8") as fs, open(pt, "w", encoding="utf-8") as ft:
            for _, s, t in unit_records(unit, data, bad, lines):
                rule, s, t = rules(s, t)
                if rule is not None:
                    dropped[rule] += 1
                    continue
                fs.write(s + "\n")
                ft.write(t + "\n")
                keys.append(text_hash(s + "\t" + t))
                if near_dup:
                    near.append(near_hash(s, t))
        with atomic_path(unit_path(folder, unit.index, ".keys.npy")) as pk, open(pk, "wb") as f:
            np.save(f, np.array(keys, dtype=np.uint64))
        if near_dup:
            with atomic_path(unit_path(folder, unit.index, ".near.npy")) as pn, open(pn, "wb") as f:
                np.save(f, np.array(near, dtype=np.uint64))
    counts = {"lines": lines[0], "kept": len(keys), "dropped": dropped, "bad": bad.reasons}
    atomic_write_json(done, counts)
    return counts


# --------------------------------------------------------------------------- all units, in order


def workers_for(data: DataConfig) -> int:
    """`data.workers`, with 0 = the cores this process may run on."""
    if data.workers > 0:
        return data.workers
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Cleaned:
    """A split's units after cleaning: their counts in unit order, the folder holding them, the bad lines."""

    folder: Path
    counts: list[dict]
    bad: BadLines

    @property
    def kept(self) -> list[int]:
        return [c["kept"] for c in self.counts]

    def dropped(self) -> dict[str, int]:
        return {rule: sum(c["dropped"][rule] for c in self.counts) for rule in RULES}


def _open_folder(folder: Path, digest: str) -> None:
    """The work folder for this digest: kept (finished units are reused) or emptied."""
    manifest = folder / "manifest.json"
    try:
        same = json.loads(manifest.read_text(encoding="utf-8")).get("inputs") == digest
    except (OSError, json.JSONDecodeError):
        same = False
    if not same:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        atomic_write_json(manifest, {"inputs": digest})


def clean_units(source: Source, recipe: Recipe, data: DataConfig, held: Held, folder: Path, digest: str) -> Cleaned:
    """Clean every unit of `source` into `folder` on `data.workers` processes, reusing the units a
    previous run with the same `digest` finished; counts in unit order, bad lines by file line."""
    _open_folder(folder, digest)
    bad = BadLines(source.label)
    total, units = plan_units(source, recipe, data, bad)
    workers = workers_for(data) if total is None else min(workers_for(data), total)
    counts: list[dict] = []
    with _Progress(source.label, total) as advance:
        for _, result in map_ordered(clean_unit, units, workers, _init_worker, (data, held, folder)):
            counts.append(result)  # type: ignore[arg-type]
            advance(result["lines"])  # type: ignore[index]
    offset = 0
    for c in counts:
        bad.merge(c["bad"], offset)
        offset += c["lines"]
    return Cleaned(folder, counts, bad)


class _Progress:
    """A transient progress bar: units done, pairs read, pairs/s, time left (when the units are known).
    Its drawing thread starts at the first unit done, after the worker processes were started."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label, self.total = label, total
        self.bar = Progress(
            TextColumn("clean {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} units · {task.fields[pairs]:,} pairs · {task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )

    def __enter__(self) -> Callable[[int], None]:
        task = self.bar.add_task(Path(self.label).name, total=self.total, pairs=0, rate="")
        done = [0, 0]  # units, pairs

        def advance(pairs: int) -> None:
            """One more unit done, of `pairs` lines."""
            self.bar.start()  # a no-op once started
            done[0], done[1] = done[0] + 1, done[1] + pairs
            elapsed = self.bar.tasks[task].elapsed or 0.0
            rate = f"{done[1] / elapsed:,.0f} pairs/s" if elapsed > 0 else ""
            self.bar.update(task, completed=done[0], pairs=done[1], rate=rate)

        return advance

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

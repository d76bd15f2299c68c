"""Exact-duplicate pairs dropped in bounded memory, the first occurrence kept.

Input: each unit's uint64 pair hashes (`nmt.data.clean` writes `uNNNNNN.keys.npy`), in unit
order; a pair's global position is its place in that order. With more than `PARTITION_PAIRS`
hashes in all, (hash, position) records are spilled to P = ceil(N / PARTITION_PAIRS) files by
hash mod P, so equal hashes share a file; each file is then sorted by hash with a stable sort
(positions were written in increasing order, so within a run of equal hashes the first is the
earliest) and every later one of a run is marked. Memory: one partition, about 16 bytes × N / P
plus the sort's scratch, and one bool per pair for the result.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PARTITION_PAIRS = 4_000_000


def first_occurrences(key_files: Sequence[Path], scratch: Path) -> list[np.ndarray]:
    """Per unit, a bool mask over its pairs: True for the first pair with its hash (over all
    units, in unit order). Spill files go to a temporary folder in `scratch`."""
    sizes = [len(np.load(p, mmap_mode="r")) for p in key_files]
    total = sum(sizes)
    keep = np.ones(total, dtype=bool)
    parts = max(1, math.ceil(total / PARTITION_PAIRS))
    if parts == 1:
        keys = np.concatenate([np.load(p) for p in key_files]) if key_files else np.zeros(0, np.uint64)
        _mark_repeats(keys, np.arange(total, dtype=np.int64), keep)
    else:
        with tempfile.TemporaryDirectory(prefix=".dedup.", dir=scratch) as tmp:
            spills = [Path(tmp) / f"p{i}" for i in range(parts)]
            _spill(key_files, spills)
            for spill in spills:
                records = np.fromfile(spill, dtype=[("key", np.uint64), ("pos", np.int64)])
                _mark_repeats(records["key"], records["pos"], keep)
    bounds = np.cumsum([0, *sizes])
    return [keep[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _spill(key_files: Sequence[Path], spills: list[Path]) -> None:
    """Append each unit's (hash, position) records to the spill file of hash mod len(spills)."""
    parts, start = len(spills), 0
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "wb")) for p in spills]
        for path in key_files:
            keys = np.load(path)
            records = np.empty(len(keys), dtype=[("key", np.uint64), ("pos", np.int64)])
            records["key"], records["pos"] = keys, np.arange(start, start + len(keys))
            start += len(keys)
            part = keys % np.uint64(parts)
            for i, f in enumerate(files):
                records[part == i].tofile(f)


def _mark_repeats(keys: np.ndarray, positions: np.ndarray, keep: np.ndarray) -> None:
    """keep[p] = False for every position whose hash appeared at an earlier position
    (`positions` increasing, as written)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    repeat = np.zeros(len(keys), dtype=bool)
    repeat[1:] = ordered[1:] == ordered[:-1]
    keep[positions[order[repeat]]] = False

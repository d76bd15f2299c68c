"""Encoded splits: the ids of every sentence of a split in one memory-mapped array.

    <run>/bin/{split}.{lang}.npy          int32 piece ids of all sentences, concatenated (no BOS/EOS)
    <run>/bin/{split}.{lang}.offsets.npy  int64, N+1 entries: sentence i is ids[off[i]:off[i+1]]

`binarize` streams a text file through SentencePiece in chunks (optionally in worker processes)
and writes both arrays without holding the split in memory; `ParallelSplit` maps them read-only.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.config import Config
from nmt.errors import NmtError
from nmt.files import atomic_path

_WORKER: dict[str, Any] = {}


def _init_worker(model_path: str, normalize: Callable[[str], str] | None) -> None:
    _WORKER["sp"] = spm.SentencePieceProcessor(model_file=model_path)
    _WORKER["normalize"] = normalize


def _encode_chunk(lines: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(flat int32 ids, int64 lengths, unk count) of one chunk of lines."""
    normalize = _WORKER["normalize"]
    if normalize is not None:
        lines = [normalize(line) for line in lines]
    pieces = _WORKER["sp"].encode(lines, out_type=int)
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    flat = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths, int(np.count_nonzero(flat == UNK_ID))


def _chunks(path: Path, size: int) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        while chunk := [line.rstrip("\n") for line in itertools.islice(f, size)]:
            yield chunk


def _map_ordered(fn: Callable, items: Iterable, workers: int, initargs: tuple) -> Iterator:
    """fn over items in order; with workers > 1 in a process pool holding at most 2*workers chunks."""
    if workers <= 1:
        _init_worker(*initargs)
        yield from map(fn, items)
        return
    with multiprocessing.get_context().Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


@contextlib.contextmanager
def _scratch(folder: Path) -> Iterator[Path]:
    """A temporary file in `folder`, removed on exit."""
    fd, name = tempfile.mkstemp(prefix=".raw.", dir=folder)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _write_npy(dest: Path, raw: Path, dtype: np.dtype, count: int) -> None:
    """Wrap a raw little-endian array file into a .npy file (header + copied bytes), atomically."""
    with atomic_path(dest) as tmp, open(tmp, "wb") as out, open(raw, "rb") as src:
        header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_1_0(out, header)
        shutil.copyfileobj(src, out, 1 << 20)


def binarize(
    text_path: Path,
    model_path: Path,
    out_prefix: Path,
    workers: int = 1,
    normalize: Callable[[str], str] | None = None,
    chunk_lines: int = 10_000,
    on_progress: Callable[[int], None] | None = None,
) -> dict:
    """Encode each line of `text_path` with the SentencePiece model at `model_path`.

    Writes `<out_prefix>.npy` (int32 ids) and `<out_prefix>.offsets.npy` (int64, N+1).
    `normalize` (picklable) is applied to each line first; `on_progress(n_lines)` after each chunk.
    Returns {"sentences", "tokens", "unk"}.
    """
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    sentences = tokens = unk = 0
    with contextlib.ExitStack() as stack:  # raw arrays first; .npy headers need the final counts
        raw_ids, raw_off = (stack.enter_context(_scratch(out_prefix.parent)) for _ in range(2))
        with open(raw_ids, "wb") as f_ids, open(raw_off, "wb") as f_off:
            np.zeros(1, dtype="<i8").tofile(f_off)
            chunks = _map_ordered(_encode_chunk, _chunks(text_path, chunk_lines), workers, (str(model_path), normalize))
            for flat, lengths, n_unk in chunks:
                flat.astype("<i4", copy=False).tofile(f_ids)
                (np.cumsum(lengths) + tokens).astype("<i8", copy=False).tofile(f_off)
                sentences, tokens, unk = sentences + len(lengths), tokens + len(flat), unk + n_unk
                if on_progress is not None:
                    on_progress(len(lengths))
        _write_npy(Path(f"{out_prefix}.npy"), raw_ids, np.dtype("<i4"), tokens)
        _write_npy(Path(f"{out_prefix}.offsets.npy"), raw_off, np.dtype("<i8"), sentences + 1)
    return {"sentences": sentences, "tokens": tokens, "unk": unk}


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise NmtError(f"{path}: not found; run `nmt vocab` first (it encodes the corpus)")
    try:
        return np.load(path, mmap_mode="r")
    except ValueError:  # a zero-length array cannot be memory-mapped
        return np.load(path)


def _open_side(bin_dir: Path, split: str, lang: str) -> tuple[np.ndarray, np.ndarray]:
    ids_path, off_path = bin_dir / f"{split}.{lang}.npy", bin_dir / f"{split}.{lang}.offsets.npy"
    ids, offsets = _load(ids_path), _load(off_path)
    if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or int(offsets[-1]) != len(ids):
        raise NmtError(f"{off_path}: offsets do not match {ids_path.name} ({len(ids)} ids); rerun `nmt vocab`")
    return ids, offsets


@dataclass
class ParallelSplit:
    """A memory-mapped, read-only parallel split. Only the (N,) length arrays live in memory."""

    split: str
    src_ids: np.ndarray  # (total src pieces,) int32, memory-mapped
    src_offsets: np.ndarray  # (N+1,) int64, memory-mapped
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    src_lengths: np.ndarray  # (N,) int64, pieces without EOS
    tgt_lengths: np.ndarray

    @classmethod
    def open(cls, run_dir: Path, split: str, config: Config) -> ParallelSplit:
        bin_dir = Path(run_dir) / "bin"
        src_ids, src_off = _open_side(bin_dir, split, config.data.src_lang)
        tgt_ids, tgt_off = _open_side(bin_dir, split, config.data.tgt_lang)
        if len(src_off) != len(tgt_off):
            raise NmtError(
                f"{bin_dir / f'{split}.{config.data.src_lang}.npy'} has {len(src_off) - 1} sentences but "
                f"{split}.{config.data.tgt_lang}.npy has {len(tgt_off) - 1}; rerun `nmt vocab`"
            )
        return cls(split, src_ids, src_off, tgt_ids, tgt_off, np.diff(src_off), np.diff(tgt_off))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw (src, tgt) ids of sentence i, no BOS/EOS; read-only views of the mapped arrays."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sentence {i} out of range for {self.split} ({len(self)} sentences)")
        i %= len(self)
        s0, s1 = self.src_offsets[i], self.src_offsets[i + 1]
        t0, t1 = self.tgt_offsets[i], self.tgt_offsets[i + 1]
        return self.src_ids[s0:s1], self.tgt_ids[t0:t1]

"""Encoded splits: token shards with a lengths index, read a window at a time.

    <run>/bin/{split}/manifest.json      format 2: pairs, shards, dtypes, bytes and sha256 of every file
    <run>/bin/{split}/sNNNN.{lang}.tok   piece ids of the shard's sentences, concatenated (no BOS/EOS),
                                         little-endian uint16 (uint32 for a vocabulary over 65,535)
    <run>/bin/{split}/sNNNN.{lang}.len   uint32 pieces per sentence, in the same order

Pair i of a split goes to shard ``splitmix64(seed, i) % S`` (S = ceil(pairs / shard_pairs); valid and
test are one shard, in corpus order), so every shard mixes the corpus's sources, and a shard is a
window the training sampler batches in alone (`nmt.batches.batching.WindowSampler`).

`encode_split` streams both text files through SentencePiece in chunks of pairs (in worker
processes, one SentencePiece thread each; a worker also prepares its pairs: normalisation and
pass-through masking), writes every file into a scratch folder and renames it into place
last: a split folder is complete or absent, and a killed encoding leaves nothing that a rerun
keeps. Its bytes depend only on the texts, the models, the seed and the shard size (not on the
worker count or the run directory). `write_split` writes the same format from id sequences.

`ParallelSplit` opens a split without loading it: per shard, the lengths are read when asked
for (`window_lengths`), and a pair's tokens with `os.pread` (page cache, not the process's memory).
A split that an older nmt encoded (`bin/{split}.{lang}.npy`, no manifest) is not read: opening
it raises an NmtError that says to rerun `nmt vocab`.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.config import Config
from nmt.data.pool import map_ordered
from nmt.data.readers import count_lines
from nmt.errors import NmtError
from nmt.files import atomic_write_json, replace_dir
from nmt.run.layout import MANIFEST, RunDir

FORMAT = 2
SHARD_PAIRS = 1_000_000  # pairs per training shard: one window of the training sampler
LENGTH_DTYPE = np.dtype("<u4")
_OPEN_WINDOWS = 2  # shards whose offsets and files stay open (the loader and a prefetch thread)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 for a vocabulary of up to 65,535 pieces, else uint32 (little-endian)."""
    return np.dtype("<u2") if vocab_size <= 65_535 else np.dtype("<u4")


def shard_of(indices: np.ndarray, seed: int, shards: int) -> np.ndarray:
    """The shard of each pair index: splitmix64 of (seed, index) modulo `shards` (int64 array)."""
    if shards == 1:
        return np.zeros(len(indices), dtype=np.int64)
    with np.errstate(over="ignore"):
        z = np.asarray(indices, dtype=np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(shards)).astype(np.int64)


def shard_count(pairs: int, shard_pairs: int | None) -> int:
    """ceil(pairs / shard_pairs), at least 1; one shard when `shard_pairs` is None."""
    return 1 if shard_pairs is None else max(1, -(-pairs // shard_pairs))


# --------------------------------------------------------------------------- writing


def _group_by_shard(
    flat: np.ndarray, lengths: np.ndarray, shard: np.ndarray, shards: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{shard: (its tokens, its lengths)} of one chunk, pairs kept in corpus order within a shard."""
    if shards == 1:
        return {0: (flat, lengths)} if len(lengths) else {}
    if shards <= 1 << 16:
        shard = shard.astype(np.uint16)  # small keys: numpy's stable sort is then a radix sort, linear
    order = np.argsort(shard, kind="stable")
    token_shard = np.repeat(shard, lengths)
    token_order = np.argsort(token_shard, kind="stable")
    line_cuts = np.searchsorted(shard[order], np.arange(shards + 1))
    token_cuts = np.searchsorted(token_shard[token_order], np.arange(shards + 1))
    groups = {}
    for k in np.flatnonzero(np.diff(line_cuts)):
        groups[int(k)] = (
            flat[token_order[token_cuts[k] : token_cuts[k + 1]]],
            lengths[order[line_cuts[k] : line_cuts[k + 1]]],
        )
    return groups


class _HashedFile:
    """A file written once, front to back, with its sha256 and size kept as it goes."""

    def __init__(self, path: Path) -> None:
        self.path, self.file = path, open(path, "wb")  # noqa: SIM115 — closed by `close`
        self.sha, self.bytes = hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha.update(data)
        self.bytes += len(data)

    def close(self) -> dict:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return {"bytes": self.bytes, "sha256": self.sha.hexdigest()}


class _SideWriter:
    """One language of a split: its `.tok` and `.len` file in every shard, appended chunk by chunk."""

    def __init__(self, folder: Path, lang: str, dtype: np.dtype, shards: int) -> None:
        self.dtype = dtype
        self.tok = [_HashedFile(folder / f"{_shard_name(k)}.{lang}.tok") for k in range(shards)]
        self.len = [_HashedFile(folder / f"{_shard_name(k)}.{lang}.len") for k in range(shards)]
        self.pairs, self.tokens = [0] * shards, [0] * shards
        self.unk = 0

    def add(self, groups: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        for k, (flat, lengths) in groups.items():
            self.tok[k].write(np.asarray(flat).astype(self.dtype, copy=False).tobytes())
            self.len[k].write(np.asarray(lengths).astype(LENGTH_DTYPE, copy=False).tobytes())
            self.pairs[k] += len(lengths)
            self.tokens[k] += len(flat)
            self.unk += int(np.count_nonzero(flat == UNK_ID))

    def close(self) -> dict[str, dict]:
        """{file name: {"bytes", "sha256"}} of every file written."""
        return {f.path.name: f.close() for f in (*self.tok, *self.len)}


def _shard_name(k: int) -> str:
    return f"s{k:04d}"


@contextlib.contextmanager
def _staging(bin_dir: Path, split: str) -> Iterator[Path]:
    """A scratch folder in `bin_dir`, renamed to `bin_dir/split` on success (the old one removed),
    deleted on failure. Leftovers of a killed run (``.{split}.tmp-*``, ``.{split}.old-*``) go first."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for stale in itertools.chain(bin_dir.glob(f".{split}.tmp-*"), bin_dir.glob(f".{split}.old-*")):
        shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{split}.tmp-", dir=bin_dir))
    try:
        yield scratch
        replace_dir(scratch, bin_dir / split)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _manifest(split: str, langs: Sequence[str], seed: int, writers: dict[str, _SideWriter], files: dict) -> dict:
    """The manifest of a split whose sides were all written (counts checked equal per shard)."""
    first = writers[langs[0]]
    shards = []
    for k in range(len(first.pairs)):
        name = _shard_name(k)
        shards.append({
            "name": name,
            "pairs": first.pairs[k],
            "tokens": {lang: writers[lang].tokens[k] for lang in langs},
            "files": {f: files[f] for lang in langs for f in (f"{name}.{lang}.tok", f"{name}.{lang}.len")},
        })  # fmt: skip
    return {
        "format": FORMAT,
        "split": split,
        "langs": list(langs),
        "pairs": sum(first.pairs),
        "seed": seed,
        "token_dtype": {lang: writers[lang].dtype.str for lang in langs},
        "length_dtype": LENGTH_DTYPE.str,
        "unk": {lang: writers[lang].unk for lang in langs},
        "shards": shards,
    }


def write_split(
    bin_dir: Path,
    split: str,
    sides: dict[str, Iterable[tuple[np.ndarray, np.ndarray]]],
    vocab_sizes: dict[str, int],
    seed: int = 1,
    shards: int = 1,
) -> dict:
    """Write `split` into `bin_dir/split` from, per language, chunks of (flat ids, lengths) in corpus
    order (the chunks may differ per language; the pairs may not). Returns the manifest.

    The one writer of the format: `encode_split` feeds it SentencePiece's output; tests and
    benchmarks feed it id sequences. NmtError when the languages' pair counts differ.
    """
    langs = list(sides)
    with _staging(Path(bin_dir), split) as scratch:
        writers = {lang: _SideWriter(scratch, lang, token_dtype(vocab_sizes[lang]), shards) for lang in langs}
        start = dict.fromkeys(langs, 0)
        for chunks in itertools.zip_longest(*sides.values()):  # the languages in turn, a chunk each
            for lang, chunk in zip(langs, chunks, strict=True):
                if chunk is None:
                    continue  # this language's chunks ended first (they may be cut differently)
                flat, lengths = np.asarray(chunk[0]), np.asarray(chunk[1])
                shard = shard_of(np.arange(start[lang], start[lang] + len(lengths)), seed, shards)
                writers[lang].add(_group_by_shard(flat, lengths, shard, shards))
                start[lang] += len(lengths)
        files = {name: digest for w in writers.values() for name, digest in w.close().items()}
        counts = {lang: sum(w.pairs) for lang, w in writers.items()}
        if len(set(counts.values())) > 1:
            raise NmtError(f"{Path(bin_dir) / split}: the languages have different pair counts {counts}")
        manifest = _manifest(split, langs, seed, writers, files)
        atomic_write_json(scratch / MANIFEST, manifest)
    return manifest


@dataclass(frozen=True)
class TextSide:
    """One language of a split to encode: its text (one sentence a line) and its SentencePiece model."""

    lang: str
    text: Path
    model: Path


class PairPrep(Protocol):
    """What a chunk of pairs becomes before encoding (`nmt.data.passthrough.PairPrep`)."""

    def lines(self, src: list[str], tgt: list[str]) -> tuple[list[str], list[str], int]:
        """(sources, targets, how many pairs were changed)."""
        ...


_WORKER: dict[str, Any] = {}


def _init_worker(models: tuple[str, str], prepare: PairPrep | None, dtypes: tuple[np.dtype, np.dtype]) -> None:
    _WORKER["sp"] = [spm.SentencePieceProcessor(model_file=m) for m in models]
    _WORKER["prepare"], _WORKER["dtypes"] = prepare, dtypes


def _ids(sp: spm.SentencePieceProcessor, lines: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids in the shard's token dtype, int64 lengths) of `lines`; one SentencePiece thread
    (the parallelism is the worker processes). Converted here, in the worker, the ids cross to the
    parent at their stored size."""
    pieces = sp.encode(lines, out_type=int, num_threads=1)
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    flat = np.fromiter(itertools.chain.from_iterable(pieces), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def _encode_chunk(chunk: tuple[list[str], list[str]]) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Both sides of a chunk of pairs, prepared (normalised/masked) then encoded: ([(flat,
    lengths) per side], pairs the preparation changed)."""
    src, tgt = chunk
    changed = 0
    prepare = _WORKER["prepare"]
    if prepare is not None:
        src, tgt, changed = prepare.lines(src, tgt)
    sides = zip(_WORKER["sp"], (src, tgt), _WORKER["dtypes"], strict=True)
    return [_ids(sp, lines, dtype) for sp, lines, dtype in sides], changed


def _chunks(paths: tuple[Path, Path], size: int) -> Iterator[tuple[list[str], list[str]]]:
    """The aligned files in chunks of `size` pairs (line counts checked equal beforehand)."""
    with open(paths[0], encoding="utf-8") as fs, open(paths[1], encoding="utf-8") as ft:
        while src := [line.rstrip("\n") for line in itertools.islice(fs, size)]:
            yield src, [line.rstrip("\n") for line in itertools.islice(ft, len(src))]


def _fan_out(stream: Iterator[list], n: int) -> list[Iterator]:
    """n iterators, the i-th yielding item i of each of `stream`'s lists. Each holds what the
    others have pulled and it has not: bounded when they are read in turn (`write_split`)."""
    queues: list[collections.deque] = [collections.deque() for _ in range(n)]

    def side(i: int) -> Iterator:
        while True:
            if not queues[i]:
                item = next(stream, None)
                if item is None:
                    return
                for q, part in zip(queues, item, strict=True):
                    q.append(part)
            yield queues[i].popleft()

    return [side(i) for i in range(n)]


def encode_split(
    bin_dir: Path,
    split: str,
    sides: Sequence[TextSide],
    seed: int,
    shard_pairs: int | None = SHARD_PAIRS,
    workers: int = 1,
    chunk_lines: int = 10_000,
    on_progress: Callable[[int], None] | None = None,
    prepare: PairPrep | None = None,
) -> dict:
    """Encode the texts of `sides` (src and tgt, aligned line by line) into `bin_dir/split`.

    Chunks of `chunk_lines` pairs go to `workers` processes, each of which prepares the pairs
    (`prepare`: normalisation and pass-through masking, `nmt.data.passthrough.PairPrep`; None:
    the lines as they are) and encodes both sides. `shard_pairs` pairs per shard (None: one
    shard, pairs in corpus order); `seed` spreads pairs over shards; `on_progress(n_pairs)` after
    each chunk. Returns {lang: {"sentences", "tokens", "unk"}, "changed_pairs": n}. NmtError
    when the texts' line counts differ.
    """
    lines = {side.lang: count_lines(side.text) for side in sides}
    if len(set(lines.values())) > 1:
        a, b = sides[0], sides[1]
        raise NmtError(f"{a.text} has {lines[a.lang]} lines but {b.text} has {lines[b.lang]}: they must align")
    vocab = {s.lang: spm.SentencePieceProcessor(model_file=str(s.model)).get_piece_size() for s in sides}
    changed = 0

    def results() -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        nonlocal changed
        chunks = _chunks((sides[0].text, sides[1].text), chunk_lines)
        models = (str(sides[0].model), str(sides[1].model))
        dtypes = (token_dtype(vocab[sides[0].lang]), token_dtype(vocab[sides[1].lang]))
        for _, (encoded, n) in map_ordered(_encode_chunk, chunks, workers, _init_worker, (models, prepare, dtypes)):
            changed += n
            if on_progress is not None:
                on_progress(len(encoded[0][1]))
            yield encoded

    streams = dict(zip((s.lang for s in sides), _fan_out(results(), len(sides)), strict=True))
    manifest = write_split(bin_dir, split, streams, vocab, seed, shard_count(lines[sides[0].lang], shard_pairs))
    counts: dict = {
        lang: {
            "sentences": manifest["pairs"],
            "tokens": sum(s["tokens"][lang] for s in manifest["shards"]),
            "unk": manifest["unk"][lang],
        }
        for lang in manifest["langs"]
    }
    return counts | {"changed_pairs": changed}


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _ShardFiles:
    """Where one shard's two sides live: token files (ids from byte 0), their dtypes, lengths files."""

    name: str
    pairs: int
    tok: tuple[Path, Path]  # (source, target)
    dtype: tuple[np.dtype, np.dtype]
    lengths: tuple[Path, Path]

    def read_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) pieces per pair, int32, read into memory (not mapped)."""
        return tuple(np.fromfile(p, dtype=LENGTH_DTYPE).astype(np.int32) for p in self.lengths)  # type: ignore[return-value]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """(n+1,) start of each pair's ids in its token file: uint32 where the shard's ids fit (half
    the memory of int64), else int64."""
    total = int(lengths.sum(dtype=np.int64))
    dtype = np.uint32 if total < 2**32 else np.int64
    out = np.zeros(len(lengths) + 1, dtype=dtype)
    np.cumsum(lengths, dtype=dtype, out=out[1:])
    return out


class _OpenShard:
    """A shard being read: its offsets in memory, its token files open; tokens read by `os.pread`."""

    def __init__(self, files: _ShardFiles) -> None:
        self.files = files
        self.offsets = tuple(_offsets(n) for n in files.read_lengths())
        self.handles: list[IO[bytes]] = [open(p, "rb", buffering=0) for p in files.tok]  # noqa: SIM115

    def side(self, side: int, j: int) -> np.ndarray:
        start, end = int(self.offsets[side][j]), int(self.offsets[side][j + 1])
        dtype = self.files.dtype[side]
        data = os.pread(self.handles[side].fileno(), (end - start) * dtype.itemsize, start * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)

    def close(self) -> None:
        for h in self.handles:
            h.close()


class ParallelSplit:
    """An encoded parallel split, opened without reading it: shard metadata in memory, a shard's
    lengths read when asked for, a pair's tokens read from the files when asked for.

    The windows of `nmt.batches.batching.WindowSampler` are the shards (`window_bounds`,
    `window_lengths`). `src_lengths` / `tgt_lengths` (read once, kept) and `src_ids` / `tgt_ids`
    are the whole split's: for splits held whole (validation) and checks, not for a training corpus.
    """

    def __init__(self, split: str, where: Path, shards: list[_ShardFiles]) -> None:
        self.split, self.where, self.shards = split, where, shards
        self.bounds = np.concatenate(([0], np.cumsum([s.pairs for s in shards], dtype=np.int64)))
        self._open: collections.OrderedDict[int, _OpenShard] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._lengths: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def open(cls, run_dir: Path, split: str, config: Config) -> ParallelSplit:
        """`run_dir`/bin's `split` for config.data's languages; NmtError (one line) naming the file
        when it is missing, incomplete or inconsistent, or naming the folder when it holds the split
        only as an older nmt wrote it (`{split}.{lang}.npy`)."""
        bin_dir = RunDir(run_dir).bin
        langs = (config.data.src_lang, config.data.tgt_lang)
        if (bin_dir / split / MANIFEST).is_file():
            return cls(split, bin_dir / split, _manifest_shards(bin_dir / split, langs))
        for old in (bin_dir / f"{split}.{lang}.npy" for lang in langs):
            if old.is_file():
                raise NmtError(
                    f"{bin_dir}: encoded with an older nmt layout ({old.name}); rerun `nmt vocab --run {run_dir}`"
                )
        raise NmtError(f"{bin_dir / split / MANIFEST}: not found; run `nmt vocab` first (it encodes the corpus)")

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def window_bounds(self) -> np.ndarray:
        """(S+1,) int64: shard k holds pairs bounds[k]:bounds[k+1] of the split."""
        return self.bounds

    def window_lengths(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) pieces per pair of shard k, int32, without BOS/EOS."""
        return self.shards[k].read_lengths()

    @property
    def src_lengths(self) -> np.ndarray:
        """(N,) int32 source pieces of the whole split (read once)."""
        return self._whole_lengths()[0]

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self._whole_lengths()[1]

    @property
    def src_ids(self) -> np.ndarray:
        """Every source id of the split, shards in order, read into memory on each call (checks, small splits)."""
        return self._whole_ids(0)

    @property
    def tgt_ids(self) -> np.ndarray:
        return self._whole_ids(1)

    def _whole_ids(self, side: int) -> np.ndarray:
        parts = [np.fromfile(s.tok[side], dtype=s.dtype[side]) for s in self.shards]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def _whole_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        if self._lengths is None:
            parts = [self.window_lengths(k) for k in range(len(self.shards))]
            self._lengths = tuple(np.concatenate([p[side] for p in parts]) for side in (0, 1))  # type: ignore[assignment]
        return self._lengths  # type: ignore[return-value]

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw (src, tgt) ids of pair i (shards in order), no BOS/EOS; read-only arrays."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sentence {i} out of range for {self.split} ({len(self)} sentences)")
        i %= len(self)
        k = int(np.searchsorted(self.bounds, i, side="right")) - 1
        with self._lock:
            shard = self._shard(k)
            j = i - int(self.bounds[k])
            return shard.side(0, j), shard.side(1, j)

    def _shard(self, k: int) -> _OpenShard:
        """Shard k opened (kept among the last `_OPEN_WINDOWS` used; older ones closed)."""
        if k in self._open:
            self._open.move_to_end(k)
            return self._open[k]
        self._open[k] = _OpenShard(self.shards[k])
        while len(self._open) > _OPEN_WINDOWS:
            self._open.popitem(last=False)[1].close()
        return self._open[k]

    def close(self) -> None:
        with self._lock:
            while self._open:
                self._open.popitem()[1].close()


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: unreadable ({e}); rerun `nmt vocab`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise NmtError(f"{path}: not an encoded split of format {FORMAT}; rerun `nmt vocab`")
    return manifest


def _manifest_shards(folder: Path, langs: tuple[str, str]) -> list[_ShardFiles]:
    """The shards a manifest lists, each file checked present with its recorded size."""
    manifest = _read_manifest(folder)
    missing = [lang for lang in langs if lang not in manifest.get("langs", [])]
    if missing:
        has = manifest.get("langs")
        raise NmtError(f"{folder / MANIFEST}: has no {missing[0]} side (it has {has}); rerun `nmt vocab`")
    dtypes = tuple(np.dtype(manifest["token_dtype"][lang]) for lang in langs)
    shards = []
    for s in manifest["shards"]:
        for name, meta in s["files"].items():
            size = (folder / name).stat().st_size if (folder / name).is_file() else None
            if size != meta["bytes"]:
                got = "missing" if size is None else f"{size} bytes, the manifest says {meta['bytes']}"
                raise NmtError(f"{folder / name}: {got}; rerun `nmt vocab`")
        tok = tuple(folder / f"{s['name']}.{lang}.tok" for lang in langs)
        lengths = tuple(folder / f"{s['name']}.{lang}.len" for lang in langs)
        shards.append(_ShardFiles(s["name"], int(s["pairs"]), tok, dtypes, lengths))  # type: ignore[arg-type]
    return shards


def encoded_files(run_dir: Path, split: str) -> list[Path]:
    """The files whose bytes define an encoded split: its manifest (which holds every shard's sha256),
    or none while the split is not encoded. For stage stamps."""
    return [p for p in [RunDir(run_dir).encoded_manifest(split)] if p.is_file()]

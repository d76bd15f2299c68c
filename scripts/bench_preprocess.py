"""Preparation at scale: each stage's wall time, throughput per core, peak memory and output size.

    python scripts/bench_preprocess.py --sizes 1000000,5000000          # corpora made from the mirror
    python scripts/bench_preprocess.py --sizes 0 --mirror DIR            # a mirror you have, as it is

A corpus of N pairs is made from the Tatoeba pairs of the local mirror, joined 1-3 at a time (so
sentences are of news-like length and mostly distinct), in the translation schema, with the
mirror's validation and test splits. Each stage then runs in a process of its own on a fresh run
directory: `download` (clean, filter, dedup → corpus/) and `vocab` (SentencePiece models and the
encoded corpus → vocab/, bin/; its steps — mask pass-through spans, sample and train the
models, encode — are timed apart from the stage's report). Memory is the peak over the stage's whole process tree (its
worker processes included), sampled every 20 ms from /proc, with anonymous and file-backed
resident memory apart. Beside the stages, the floor: the bare SentencePiece encoding of the same
cleaned text with the same models on the same cores (one process per core, one thread each).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent
MIRROR = ROOT.parent / "shared" / "data"
CORPUS_DIR = "tatoeba-zh-en"  # the folder the tatoeba recipe reads in a mirror


# --------------------------------------------------------------------------- the corpus


def make_corpus(pairs: int, source: Path, out: Path, seed: int = 0) -> Path:
    """A mirror at `out` whose train split holds `pairs` pairs made of `source`'s Tatoeba training
    pairs joined 1-3 at a time (seeded); validation and test are `source`'s. Returns `out`; one
    made before (complete: its train split is renamed into place last) is used as it is."""
    folder = out / CORPUS_DIR
    if (folder / "train.jsonl").is_file():
        return out
    rows = [json.loads(line)["translation"] for line in (source / CORPUS_DIR / "train.jsonl").open(encoding="utf-8")]
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    partial = folder / "train.jsonl.partial"
    with partial.open("w", encoding="utf-8") as f:
        for _ in range(pairs):
            picked = rng.sample(rows, rng.randint(1, 3))
            pair = {"zh": "".join(r["zh"] for r in picked), "en": " ".join(r["en"] for r in picked)}
            f.write(json.dumps({"translation": pair}, ensure_ascii=False) + "\n")
    for split in ("validation", "test"):
        for name in (f"{split}.jsonl", f"{split}.codes.txt"):
            if (source / CORPUS_DIR / name).is_file():
                (folder / name).write_bytes((source / CORPUS_DIR / name).read_bytes())
    partial.rename(folder / "train.jsonl")
    return out


# --------------------------------------------------------------------------- memory of a process tree


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (through /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _rss(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of one process; (0, 0) once it is gone."""
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("RssFile:"):
                    file = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, file


class PeakMemory:
    """Samples a process tree's resident memory in a thread; keeps the peaks of the sums."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        self.pid, self.every = pid, every
        self.anon = self.file = self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            sizes = [_rss(p) for p in _tree(self.pid)]
            anon, file = sum(a for a, _ in sizes), sum(f for _, f in sizes)
            self.anon, self.file, self.total = max(self.anon, anon), max(self.file, file), max(self.total, anon + file)


# --------------------------------------------------------------------------- stages


def _stage(name: str, config_args: tuple[str, list[str]], run_dir: str, mirror: str) -> None:
    """The body of a stage's process."""
    from nmt.config import load_config
    from nmt.run.dirs import init_run

    config = load_config(*config_args)
    init_run(config, Path(run_dir))
    if name == "download":
        from nmt.data.corpus import prepare_corpus

        prepare_corpus(config, Path(run_dir), mirror=mirror)
    else:
        from nmt.data.vocab import build_vocab

        build_vocab(config, Path(run_dir))


def run_stage(name: str, config_args: tuple[str, list[str]], run_dir: Path, mirror: Path) -> dict:
    """One stage in a process of its own: {"seconds", "anon", "file", "total"} (bytes)."""
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_stage, args=(name, config_args, str(run_dir), str(mirror)))
    start = time.perf_counter()
    proc.start()
    with PeakMemory(proc.pid) as peak:
        proc.join()
    seconds = time.perf_counter() - start
    if proc.exitcode != 0:
        raise SystemExit(f"stage {name} failed (exit {proc.exitcode})")
    return {"seconds": seconds, "anon": peak.anon, "file": peak.file, "total": peak.total}


def _encode_part(args: tuple[str, list[str]]) -> int:
    import sentencepiece as spm

    model, lines = args
    sp = spm.SentencePieceProcessor(model_file=model, num_threads=1)
    return sum(len(ids) for ids in sp.encode(lines))


def bare_encoding(run_dir: Path, cores: int) -> dict:
    """The floor: corpus/train.{zh,en} encoded with the run's models, one process per core,
    one SentencePiece thread each, in blocks; {"seconds", "tokens"}."""
    start, tokens = time.perf_counter(), 0
    with mp.get_context("spawn").Pool(cores) as pool:
        for lang in ("zh", "en"):
            model = str(RunDir(run_dir).vocab_model(lang))
            blocks = _blocks(RunDir(run_dir).corpus_file("train", lang), 20_000)
            tokens += sum(pool.imap(_encode_part, ((model, b) for b in blocks)))
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def _blocks(path: Path, size: int):
    block: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            block.append(line.rstrip("\n"))
            if len(block) == size:
                yield block
                block = []
    if block:
        yield block


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


# --------------------------------------------------------------------------- report


def bench(pairs: int, mirror: Path, config_args: tuple[str, list[str]], work: Path, cores: int) -> list[dict]:
    """Rows of the table for one corpus: one per stage, and the floor."""
    run = work / f"run-{pairs}"
    rows = []
    for stage, out in (("download", ["corpus"]), ("vocab", ["vocab", "bin"])):
        res = run_stage(stage, config_args, run, mirror)
        res.update(stage=stage, pairs=pairs, out=sum(_bytes(run / o) for o in out))
        rows.append(res)
        print(_row(res, cores), flush=True)
    kept = sum(1 for _ in RunDir(run).corpus_file("train", "zh").open(encoding="utf-8"))
    steps = json.loads(RunDir(run).stamp("vocab").read_text(encoding="utf-8"))["report"].get("seconds", {})
    for step, seconds in steps.items():  # the vocab stage's own steps (nmt.data.vocab.build_vocab)
        rows.append({"stage": f"  {step}", "pairs": kept, "seconds": seconds} | dict.fromkeys(SIZES, 0))
        print(_row(rows[-1], cores), flush=True)
    floor = bare_encoding(run, cores)
    rows.append({"stage": "bare spm encode", "pairs": kept, **dict.fromkeys(SIZES, 0), **floor})
    print(_row(rows[-1], cores), flush=True)
    if "encode" in steps:
        print(f"{'':>11}encode / bare spm encode: {steps['encode'] / floor['seconds']:.2f}x", flush=True)
    return rows


SIZES = ("out", "anon", "file", "total")  # bytes; 0 in rows that are not a stage's own process
HEADER = (
    f"{'pairs':>10} {'stage':<16}{'wall s':>9}{'pairs/s/core':>14}"
    f"{'anon MB':>9}{'file MB':>9}{'peak MB':>9}{'out MB':>9}"
)


def _row(r: dict, cores: int) -> str:
    mb = 1 << 20
    rate = r["pairs"] / r["seconds"] / cores
    return (
        f"{r['pairs']:>10,} {r['stage']:<16}{r['seconds']:>9.1f}{rate:>14,.0f}"
        f"{r['anon'] / mb:>9.0f}{r['file'] / mb:>9.0f}{r['total'] / mb:>9.0f}{r['out'] / mb:>9.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100000", help="corpus sizes in pairs, comma-separated (0: the mirror as it is)"
    )
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="the mirror the corpora are made from")
    parser.add_argument("--config", default=str(ROOT / "configs" / "base.yaml"))
    parser.add_argument("--set", action="append", default=[], help="config overrides, section.key=value")
    parser.add_argument(
        "--work", type=Path, default=None, help="made corpora kept here (mirror-N, reused); runs too (default: temp)"
    )
    args = parser.parse_args(argv)
    if not (args.mirror / CORPUS_DIR / "train.jsonl").is_file():
        parser.error(f"--mirror {args.mirror}: no {CORPUS_DIR}/train.jsonl there")
    cores = len(os.sched_getaffinity(0))
    config_args = (args.config, ["data.corpus=tatoeba", *args.set])
    from nmt.hw.host import cpu_model

    print(f"CPU: {cpu_model()}, {cores} cores; config {args.config} {' '.join(config_args[1])}")
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="nmt-bench-prep-", dir=args.work) as tmp:
        corpora = args.work or Path(tmp)  # made corpora are kept in --work for the next run
        for pairs in (int(s) for s in args.sizes.split(",")):
            mirror = args.mirror if pairs == 0 else make_corpus(pairs, args.mirror, corpora / f"mirror-{pairs}")
            bench(pairs or _count(mirror), mirror, config_args, Path(tmp), cores)
    return 0


def _count(mirror: Path) -> int:
    return sum(1 for _ in (mirror / CORPUS_DIR / "train.jsonl").open(encoding="utf-8"))


if __name__ == "__main__":
    sys.exit(main())

"""Ensemble of independently seeded models against each alone: BLEU/chrF and decoding speed.

Trains `--seeds` runs of a config at the same time, each pinned to its own core (one thread;
train.seed = 1, 2, ...; checkpoint chosen on validation by `nmt pipeline`), unless `--runs` names
finished runs. Members of an ensemble must share their vocabularies, and two runs of one config
trained different SentencePiece models here (same corpus and data.seed, vocab.workers 2), so
seed 1's corpus and vocabularies are prepared first and every other seed starts as a copy of
them (`nmt pipeline` then skips both). Then decodes the same test sentences with each model
alone and with all of them as one ensemble (`--checkpoint` once per model: log-probabilities
averaged at every step), beam search, native engine, on every core. Prints one table.

    python scripts/bench_ensemble.py --minutes 10 --sentences 2000
    python scripts/bench_ensemble.py --runs runs/a runs/b
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent


def prepare(config: str, first: Path, others: list[Path], mirror: str) -> None:
    """Corpus and vocabularies of the first run, copied into the others (their stamps too)."""
    for stage in (["download", "--mirror", mirror], ["vocab"]):
        subprocess.run(
            [sys.executable, "-m", "nmt", stage[0], "-c", config, "-r", str(first), *stage[1:]],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
    for run in others:
        run.mkdir(parents=True, exist_ok=True)
        for name in ("corpus", "vocab", "bin"):
            shutil.copytree(first / name, run / name, dirs_exist_ok=True)
        for name in ("config.yaml", "download.stamp.json", "vocab.stamp.json"):
            shutil.copyfile(first / name, run / name)


def train(config: str, run: Path, seed: int, minutes: float, mirror: str, core: int) -> Path:
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "nmt", "pipeline", "-c", config, "-r", str(run)]
    cmd += ["--mirror", mirror, "-s", f"train.seed={seed}", "-s", f"train.max_time={minutes * 60:.0f}s"]
    with (run.parent / f"{run.name}.log").open("a") as log:
        subprocess.run(
            cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
    return run


def evaluate(run: Path, checkpoints: list[Path], name: str, src: Path, ref: Path) -> dict:
    cmd = [sys.executable, "-m", "nmt", "eval", "-r", str(run), "--src", str(src), "--ref", str(ref), "--name", name]
    cmd += [arg for c in checkpoints for arg in ("--checkpoint", str(c))]
    cmd += ["--precision", "fp32"]  # the same precision for every row (an ensemble decodes in fp32 too)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(RunDir(run).eval_report(name).read_text())


def test_subset(run: Path, n: int, out: Path) -> tuple[Path, Path]:
    """A seeded subset of the run's (cleaned) test split as two text files."""
    src = RunDir(run).corpus_file("test", "zh").read_text(encoding="utf-8").splitlines()
    ref = RunDir(run).corpus_file("test", "en").read_text(encoding="utf-8").splitlines()
    idx = sorted(random.Random(1).sample(range(len(src)), min(n, len(src))))
    files = out / "test-subset.zh", out / "test-subset.en"
    for path, lines in zip(files, (src, ref), strict=True):
        path.write_text("".join(lines[i] + "\n" for i in idx), encoding="utf-8")
    return files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/small.yaml")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--minutes", type=float, default=10.0, help="train.max_time of each run")
    p.add_argument("--runs", type=Path, nargs="*", help="finished runs instead of training")
    p.add_argument("--mirror", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-ensemble")
    p.add_argument("--sentences", type=int, default=2000, help="test sentences (seeded subset)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runs = a.runs
    if not runs:
        cores = os.cpu_count() or 1
        prepare(a.config, a.out / "seed1", [a.out / f"seed{s}" for s in range(2, a.seeds + 1)], a.mirror)
        with ThreadPoolExecutor(a.seeds) as pool:
            jobs = [
                pool.submit(train, a.config, a.out / f"seed{s}", s, a.minutes, a.mirror, (s - 1) % cores)
                for s in range(1, a.seeds + 1)
            ]
            runs = [j.result() for j in jobs]
    finals = [r / "checkpoints" / "final.safetensors" for r in runs]
    src, ref = test_subset(runs[0], a.sentences, a.out)
    rows = [
        (f"{r.name} alone", evaluate(r, [f], "ensemble-alone", src, ref)) for r, f in zip(runs, finals, strict=True)
    ]
    rows.append((f"ensemble of {len(runs)}", evaluate(runs[0], finals, "ensemble-all", src, ref)))
    print(f"\n{a.sentences} Tatoeba test sentences (seeded subset), beam 5, native fp32, {os.cpu_count()} threads")
    print("| model | BLEU | chrF | sentences/s |\n|---|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['speed']['sentences_per_s']:.1f} |")


if __name__ == "__main__":
    main()

"""Peak memory of vocabulary training (sample + both SentencePiece models) against corpus size and sample budget.

Makes a train corpus of `--pairs` pairs by joining 1 to 3 random Tatoeba pairs (seeded; cached
under --work), then runs `nmt.data.vocab.train_models` on it in a child process and samples
/proc every 50 ms over that process and its workers: RssAnon and RssFile summed over the
process tree (at their peaks, taken apart), the parent's peak RssAnon (the sampling pass), the
largest worker's (one SentencePiece side) and the largest VmHWM of one process. A forked worker
counts the pages it shares with its parent in its own RSS, so the tree sums overstate what the
machine holds by up to the parent's RSS at the fork.

    python scripts/bench_vocab_memory.py --pairs 200000 1000000 --sample-chars 2000000 8000000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path

TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-zh-en" / "train.jsonl"

CHILD = """
import json, sys, time, warnings
from pathlib import Path
from nmt.config import config_from_dict
from nmt.data.vocab import train_models
warnings.simplefilter("ignore")
run, chars, workers, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = config_from_dict({"vocab": {"sample_chars": chars, "workers": workers, "src_size": size, "tgt_size": size}})
start = time.perf_counter()
report = train_models(cfg, run, {f"train.{l}": run / "corpus" / f"train.{l}" for l in ("zh", "en")}, ("zh", "en"))
print(json.dumps({"seconds": time.perf_counter() - start, "report": report}))
"""


def make_corpus(folder: Path, pairs: int, source: Path) -> Path:
    """`folder`/corpus/train.{zh,en}: `pairs` pairs, each 1-3 random Tatoeba pairs joined by a space."""
    corpus = folder / "corpus"
    if (corpus / "train.en").is_file():
        return folder
    rows = [json.loads(line)["translation"] for line in source.open(encoding="utf-8")]
    rng = random.Random(pairs)
    corpus.mkdir(parents=True, exist_ok=True)
    with open(corpus / "train.zh", "w", encoding="utf-8") as zh, open(corpus / "train.en", "w", encoding="utf-8") as en:
        for _ in range(pairs):
            picked = rng.choices(rows, k=rng.randint(1, 3))
            zh.write("".join(r["zh"] for r in picked) + "\n")
            en.write(" ".join(r["en"] for r in picked) + "\n")
    return folder


def _status(pid: int) -> dict[str, int]:
    """RssAnon, RssFile, VmHWM of `pid` in KiB (empty once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = (line.split(":") for line in text.splitlines())
    return {k: int(v.split()[0]) for k, v in fields if k in ("RssAnon", "RssFile", "VmHWM")}


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):  # it has exited
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return out


def measure(folder: Path, chars: int, workers: int, size: int) -> dict:
    """Run train_models in a child; its result plus, in MiB: peak RssAnon and RssFile summed over the
    tree, the parent's (sampling) peak RssAnon, the largest worker's peak RssAnon, the largest VmHWM."""
    cmd = [sys.executable, "-c", CHILD, str(folder), str(chars), str(workers), str(size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    anon = file = 0
    peaks: dict[int, dict[str, int]] = {}  # pid -> its largest RssAnon and VmHWM
    while proc.poll() is None:
        stats = {p: _status(p) for p in _tree(proc.pid)}
        anon = max(anon, sum(s.get("RssAnon", 0) for s in stats.values()))
        file = max(file, sum(s.get("RssFile", 0) for s in stats.values()))
        for p, s in stats.items():
            peak = peaks.setdefault(p, {"RssAnon": 0, "VmHWM": 0})
            peak.update({k: max(peak[k], s.get(k, 0)) for k in peak})
        time.sleep(0.05)
    out = json.loads(proc.stdout.read().strip().splitlines()[-1])
    workers_anon = [v["RssAnon"] for p, v in peaks.items() if p != proc.pid] or [0]
    return out | {
        "anon_mib": anon / 1024,
        "file_mib": file / 1024,
        "parent_anon_mib": peaks.get(proc.pid, {}).get("RssAnon", 0) / 1024,
        "worker_anon_mib": max(workers_anon) / 1024,
        "hwm_mib": max([0] + [v["VmHWM"] for v in peaks.values()]) / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[200_000, 1_000_000])
    ap.add_argument("--sample-chars", type=int, nargs="+", default=[2_000_000, 8_000_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--size", type=int, default=8000, help="vocab.src_size and tgt_size")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_vocab_memory"))
    ap.add_argument("--tatoeba", type=Path, default=TATOEBA)
    args = ap.parse_args()
    print(
        "| pairs | sample chars/side | zh sample lines | en sample lines | s | tree RssAnon MiB | tree RssFile MiB "
        "| parent RssAnon MiB | largest worker RssAnon MiB | max VmHWM MiB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pairs in args.pairs:
        folder = make_corpus(args.work / str(pairs), pairs, args.tatoeba)
        for chars in args.sample_chars:
            r = measure(folder, chars, args.workers, args.size)
            zh, en = r["report"]["zh"]["sample"], r["report"]["en"]["sample"]
            cells = [f"{pairs:,}", f"{chars:,}", f"{zh['sentences']:,}", f"{en['sentences']:,}", f"{r['seconds']:.0f}"]
            cells += [f"{r[k]:.0f}" for k in ("anon_mib", "file_mib", "parent_anon_mib", "worker_anon_mib", "hwm_mib")]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

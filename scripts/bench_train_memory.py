#!/usr/bin/env python
"""The trainer's resident memory against the corpus size: anonymous and file-backed apart.

For each corpus size, writes a training split of synthetic token ids straight to disk (no
SentencePiece: ids 4..vocab-1, 3..40 pieces a side), in the sharded layout (`nmt.data.encoded`)
or with --legacy in the older one (int32 ids + int64 offsets per language, what main's code
reads), then trains a small model for --steps updates in a child process whose RssAnon and
RssFile this process samples from /proc every 20 ms. Prints one JSON line per size and a table.

    python scripts/bench_train_memory.py --sizes 50000,1000000 --steps 200
    PYTHONPATH=<other checkout> python scripts/bench_train_memory.py --legacy ...   # the other code

`--code` is the checkout whose `nmt` trains (default: this one); the data are always written by
this script, so two checkouts train on the same pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nmt writes the data, whatever PYTHONPATH says

from nmt.run.layout import RunDir  # noqa: E402

VOCAB = 8000
CHUNK = 200_000
MODEL = [
    f"vocab.src_size={VOCAB}", f"vocab.tgt_size={VOCAB}", "model.d_model=64", "model.heads=4",
    "model.encoder_layers=2", "model.decoder_layers=2", "model.ffn_dim=256", "train.max_tokens=2048",
    "train.threads=1", "train.eval_every=100000", "train.eval_sentences=10", "train.log_every=10",
    "train.device=cpu", "train.precision=fp32", "train.warmup=100",
]  # fmt: skip

CHILD = """
import sys
from pathlib import Path
from nmt.config import load_config
from nmt.model.transformer import build_model
from nmt.train.loop import fit
# build= given: no matmul-peak measurement (cached per host, so it would weigh on the first run only)
fit(load_config(Path(sys.argv[1]), sys.argv[3:]), Path(sys.argv[2]), build=build_model)
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="50000,1000000", help="training pairs, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="updates trained (the first N)")
    p.add_argument("--work", type=Path, default=Path("/tmp/nmt-bench-memory"), help="where the runs are written")
    p.add_argument("--legacy", action="store_true", help="write the older layout (int32 .npy + offsets)")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose nmt trains")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def synthetic_chunks(n: int, seed: int, side: int):
    """(flat ids, lengths) of n pairs' `side`, CHUNK pairs at a time (the same pairs for any layout)."""
    rng = np.random.default_rng((seed, side))
    for start in range(0, n, CHUNK):
        lengths = rng.integers(3, 41, min(CHUNK, n - start))
        yield rng.integers(4, VOCAB, int(lengths.sum())).astype(np.int32), lengths


def write_legacy(bin_dir: Path, split: str, n: int, seed: int) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("zh", "en")):
        ids = [flat for flat, _ in synthetic_chunks(n, seed, side)]
        lengths = np.concatenate([lens for _, lens in synthetic_chunks(n, seed, side)])
        np.save(bin_dir / f"{split}.{lang}.npy", np.concatenate(ids))
        np.save(bin_dir / f"{split}.{lang}.offsets.npy", np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))


def write_sharded(bin_dir: Path, split: str, n: int, seed: int) -> None:
    from nmt.data.encoded import SHARD_PAIRS, shard_count, write_split

    sides = {lang: synthetic_chunks(n, seed, side) for side, lang in enumerate(("zh", "en"))}
    shards = shard_count(n, SHARD_PAIRS) if split == "train" else 1
    write_split(bin_dir, split, sides, {"zh": VOCAB, "en": VOCAB}, seed=1, shards=shards)


def prepare(run: Path, n: int, legacy: bool, seed: int) -> None:
    """The run's train (n pairs) and valid (200 pairs) splits, written once."""
    done = run / "prepared.json"
    if done.is_file() and json.loads(done.read_text()) == {"pairs": n, "legacy": legacy, "seed": seed}:
        return
    shutil.rmtree(run, ignore_errors=True)
    write = write_legacy if legacy else write_sharded
    write(RunDir(run).bin, "train", n, seed)
    write(RunDir(run).bin, "valid", 200, seed + 1)
    done.write_text(json.dumps({"pairs": n, "legacy": legacy, "seed": seed}))


def measure(run: Path, code: Path, steps: int) -> dict:
    """Train `steps` updates from scratch in a child; its peak RssAnon and RssFile (MiB) and wall time."""
    for stale in (RunDir(run).checkpoints, RunDir(run).tb, RunDir(run).train_log):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(True)
    overrides = [*MODEL, f"train.max_steps={steps}"]
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CHILD, str(ROOT / "configs" / "tiny.yaml"), str(run), *overrides]
    start = time.monotonic()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"RssAnon": 0, "RssFile": 0, "VmHWM": 0}
    status = Path(f"/proc/{child.pid}/status")
    while child.poll() is None:
        try:
            for line in status.read_text().splitlines():
                key, _, value = line.partition(":")
                if key in peak:
                    peak[key] = max(peak[key], int(value.split()[0]))
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.02)
    err = child.stderr.read() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"training failed ({child.returncode}): {err[-2000:]}")
    mib = {k: round(v / 1024, 1) for k, v in peak.items()}
    return {"anon_mib": mib["RssAnon"], "file_mib": mib["RssFile"], "hwm_mib": mib["VmHWM"],
            "wall_s": round(time.monotonic() - start, 1)}  # fmt: skip


def main() -> None:
    args = parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        run = args.work / f"{'legacy' if args.legacy else 'sharded'}-{n}"
        t0 = time.monotonic()
        prepare(run, n, args.legacy, args.seed)
        row = {"pairs": n, "layout": "legacy" if args.legacy else "sharded", "code": str(args.code),
               "prepare_s": round(time.monotonic() - t0, 1), **measure(run, args.code, args.steps)}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n| pairs | layout | peak RssAnon MiB | peak RssFile MiB | VmHWM MiB | wall s ({args.steps} updates) |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        cells = (f"{r['pairs']:,}", r["layout"], r["anon_mib"], r["file_mib"], r["hwm_mib"], r["wall_s"])
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()

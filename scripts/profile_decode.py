#!/usr/bin/env python
"""Where decoding time goes: torch.profiler over `Translator.translate` on a run's test sentences.

Prints the operators sorted by their own CPU time, with their share of the profiled wall time
(the rest is Python between operators), so that the cost of each part of a decoding step
(matmuls, cache copies, masks, search bookkeeping) can be named.

    python scripts/profile_decode.py --run runs/small --beam 5 --batch 64 --sentences 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmt.decode.evaluate import read_lines  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.run.checkpoints import latest_checkpoint  # noqa: E402
from nmt.run.layout import RunDir  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=Path("runs/small"))
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the run's newest step checkpoint")
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=25, help="operators to list")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    checkpoint = args.checkpoint or latest_checkpoint(RunDir(args.run).checkpoints)
    tr = Translator.from_run(args.run, checkpoint, device="cpu", precision=args.precision)
    tr.config.decode.batch_size, tr.config.decode.max_tokens = args.batch, 1 << 30
    src = read_lines(RunDir(args.run).corpus_file("test", "zh"))[: args.sentences]
    tr.translate(src[: 2 * args.batch], beam=args.beam)  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tr.translate(src, beam=args.beam)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    total_us = wall * 1e6
    op_us = sum(e.self_cpu_time_total for e in events)
    print(f"# {checkpoint}  beam={args.beam} batch={args.batch} precision={tr.precision} sentences={len(src)}")
    print(f"# profiled wall {wall:.2f}s; operators {op_us / total_us:.0%} of it, the rest is Python/profiler")
    print(f"{'operator':45s} {'calls':>8s} {'self ms':>9s} {'share':>6s}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.rows]:
        share = e.self_cpu_time_total / total_us
        print(f"{e.key[:45]:45s} {e.count:8d} {e.self_cpu_time_total / 1e3:9.1f} {share:6.1%}")


if __name__ == "__main__":
    main()

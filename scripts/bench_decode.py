#!/usr/bin/env python
"""Decoding speed and quality of a trained run, on a fixed seeded subset of its test split.

For each precision (fp32, bf16 autocast, int8 dynamic quantisation of the linear layers)
and batch size, runs greedy and beam search and prints sentences/s, target tokens/s and
BLEU, so that no speed-up silently costs quality. Time is the model's own search time after
loading (tokenisation included, file I/O excluded), as the peers' own timers report it.

    python scripts/bench_decode.py --run runs/small
    python scripts/bench_decode.py --run runs/small --batches 64 --precisions fp32,int8
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmt.device import fast_bf16_available  # noqa: E402
from nmt.evaluate import read_lines, score  # noqa: E402
from nmt.translate import Translator  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=Path("runs/small"))
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--sentences", type=int, default=2000, help="size of the seeded test subset")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--batch1-sentences", type=int, default=200, help="subset size at batch 1 (slow)")
    p.add_argument("--precisions", default="fp32,bf16,int8")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--force-bf16", action="store_true", help="run bf16 even where it is emulated (very slow)")
    return p.parse_args()


def subset(run: Path, n: int, seed: int) -> tuple[list[str], list[str]]:
    src = read_lines(run / "corpus" / "test.zh")
    ref = read_lines(run / "corpus" / "test.en")
    idx = sorted(random.Random(seed).sample(range(len(src)), min(n, len(src))))
    return [src[i] for i in idx], [ref[i] for i in idx]


def load(args: argparse.Namespace, precision: str) -> Translator:
    tr = Translator.from_run(
        args.run, checkpoint=args.checkpoint, device="cpu", precision="bf16" if precision == "bf16" else "fp32"
    )
    if precision == "int8":
        tr.model.split_projections()  # sliced and tied weights as nn.Linear, so that they are quantised too
        tr.model = torch.ao.quantization.quantize_dynamic(tr.model, {torch.nn.Linear}, dtype=torch.qint8)
        tr.engine.model = tr.model
        n_int8 = sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in tr.model.modules())
        n_fp32 = sum(type(m) is torch.nn.Linear for m in tr.model.modules())
        print(f"# int8: {n_int8} dynamic int8 linear layers, {n_fp32} fp32 linear layers left", flush=True)
    return tr


def measure(tr: Translator, src: list[str], ref: list[str], batch: int, beam: int) -> dict:
    tr.config.decode.batch_size = batch
    tr.config.decode.max_tokens = 1 << 30
    tr.translate(src[: min(len(src), 2 * batch)], beam=beam)  # warm-up
    tr.stats.reset()
    start = time.perf_counter()
    hyps = tr.translate(src, beam=beam)
    wall = time.perf_counter() - start
    seconds = tr.stats.seconds or wall
    return {
        "sent_s": len(src) / seconds,
        "tok_s": tr.stats.tgt_tokens / seconds,
        "bleu": score(hyps, ref)["bleu"],
        "n": len(src),
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src, ref = subset(args.run, args.sentences, args.seed)
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"# bench_decode: run={args.run} subset={len(src)} seed={args.seed} torch={torch.__version__} "
        f"threads={torch.get_num_threads()} cpu={platform.processor() or platform.machine()} "
        f"fast_bf16={fast_bf16_available(torch.device('cpu'))} date={time.strftime('%Y-%m-%d')}"
    )
    print()
    print("| precision | batch | search | sentences | sentences/s | target tokens/s | BLEU |")
    print("|---|---:|---|---:|---:|---:|---:|")
    fast_bf16 = fast_bf16_available(torch.device("cpu"))
    for precision in args.precisions.split(","):
        if precision == "bf16" and not fast_bf16 and not args.force_bf16:
            print(
                "| bf16 | | | | skipped: no native bf16 on this CPU (emulated, ~150x slower than fp32); "
                "--force-bf16 runs it | | |",
                flush=True,
            )
            continue
        tr = load(args, precision)
        for batch in batches:
            n = args.batch1_sentences if batch == 1 else len(src)
            for name, beam in (("greedy", 1), (f"beam {args.beam}", args.beam)):
                r = measure(tr, src[:n], ref[:n], batch, beam)
                print(
                    f"| {precision} | {batch} | {name} | {r['n']} | {r['sent_s']:.1f} | {r['tok_s']:.0f} "
                    f"| {r['bleu']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

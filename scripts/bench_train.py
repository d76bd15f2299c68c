#!/usr/bin/env python
"""Training throughput of the peers' reference shape, per precision and attention backend.

Shape (issue 6, identical for every toolkit compared): 3+3 layers, d_model 256, 4 heads,
FFN 1024, pre-norm, tied decoder embedding, unigram SentencePiece zh 8k / en 5.8k, ~4096-token
batches, label smoothing 0.1, Adam(0.9, 0.98), lr 1e-3, inverse-sqrt warmup 1000, Tatoeba
train. Each variant runs in its own process (so peak RSS is its own), trains `--warmup`
updates untimed, then `--steps` timed updates on real batches in the sampler's order.

With `--config` a recipe is measured as it is instead (its own shape, batch size and vocabulary;
variants still set the precision and the attention backend, ``auto`` leaves the recipe's). Its
batches are the plain training pairs in the sampler's order: no copy examples or joined pairs and no
shared piece rows; guided alignment runs on the runs the plain pairs copy (placeholders, digits).
`scripts/profile_train.py` builds the whole of `nmt train`'s set-up instead.

MFU = analytic training FLOPs of the timed batches (nmt.model.flops.train_flops, formula printed
below, real tokens only) / time / the matmul peak of this machine measured in the same run
(fp32 and bf16, 2048² matmuls), so the figure is a ratio that survives a noisy machine. The table
gives it over all timed updates and as the median of the updates' own MFU (what train.log's
windows show).

    python scripts/bench_train.py                      # fp32/bf16 × sdpa/math
    python scripts/bench_train.py --variants fp32-sdpa,fp32-sdpa-compile --steps 50
    python scripts/bench_train.py --config configs/small.yaml --variants fp32-auto,bf16-auto --steps 150
    python scripts/bench_train.py --config configs/small.yaml --variants bf16-auto-autocast,bf16-auto --steps 150
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.config import Config, load_config  # noqa: E402
from nmt.hw.device import fast_bf16_available, set_threads, training_precision  # noqa: E402
from nmt.hw.host import cpu_model  # noqa: E402
from nmt.model.flops import PEAK_DTYPES, matmul_peak_flops, peak_size, train_flops  # noqa: E402

REFERENCE = [
    "vocab.src_size=8000", "vocab.tgt_size=5800", "model.d_model=256", "model.heads=4",
    "model.encoder_layers=3", "model.decoder_layers=3", "model.ffn_dim=1024", "model.norm=pre",
    "model.tie_embeddings=true", "train.max_tokens=4096", "train.label_smoothing=0.1", "train.lr=0.001",
    "train.warmup=1000", "model.dropout=0.1", "train.max_len=128",
]  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="run dir with (or for) the data (default runs/bench-<name>)")
    p.add_argument("--config", type=Path, default=None, help="measure this recipe as it is, not the reference shape")
    p.add_argument("--mirror", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--variants", default="fp32-sdpa,fp32-math,bf16-sdpa,bf16-math")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--force-bf16", action="store_true", help="run bf16 even where it is emulated (very slow)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    return p.parse_args()


def reference_config(variant: str, recipe: Path | None = None) -> Config:
    """The config of `variant` ("precision-backend[-compile][-autocast]"): the reference shape, or
    `recipe` as it is. ``autocast``: bf16 on a CPU under autocast over the fp32 weights instead of
    in a bf16 copy of them (``train.bf16_weight_copy``)."""
    precision, backend, *extra = variant.split("-")
    overrides = [
        f"train.precision={precision}", f"model.attention={backend}",
        f"train.compile={'true' if 'compile' in extra else 'false'}",
        f"train.bf16_weight_copy={'false' if 'autocast' in extra else 'true'}",
    ]  # fmt: skip
    if recipe is not None:
        return load_config(recipe, overrides)
    return load_config(ROOT / "configs" / "small.yaml", REFERENCE + overrides + ["name=bench-ref"])


def prepare_data(args: argparse.Namespace) -> None:
    from nmt.data.corpus import prepare_corpus
    from nmt.data.vocab import build_vocab
    from nmt.run.dirs import init_run

    config = reference_config("fp32-sdpa", getattr(args, "config", None))
    init_run(config, args.run, latest=False)  # a benchmark never becomes the default run
    prepare_corpus(config, args.run, mirror=args.mirror)
    build_vocab(config, args.run)


def run_one(args: argparse.Namespace, variant: str) -> dict:
    """Train one variant in this process; return its measurements."""
    from nmt.batches.batching import TokenBatchSampler, load_batch
    from nmt.data.encoded import ParallelSplit
    from nmt.data.tokenizer import load_tokenizers
    from nmt.model.transformer import build_model
    from nmt.train.alignment import copy_keys
    from nmt.train.update import Trainer

    config = reference_config(variant, args.config)
    set_threads(args.threads)
    torch.manual_seed(1)
    src_tok, tgt_tok = load_tokenizers(args.run, config)
    data = ParallelSplit.open(args.run, "train", config)
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, config.train.max_tokens, config.train.max_len)
    batches = sampler.epoch_batches(0)
    model = build_model(config, src_tok.vocab_size, tgt_tok.vocab_size)
    if config.train.compile:
        model = torch.compile(model)
    device = torch.device("cpu")
    keys = copy_keys(src_tok, tgt_tok) if config.train.guided_alignment else None  # on the plain pairs' runs
    precision = training_precision(device, config.train.precision)
    trainer = Trainer(model, config.train, device, precision=precision, copy_keys=keys)
    losses, tgt_tokens, all_tokens, flops, seconds, rates = [], 0, 0, 0.0, 0.0, []
    for i in range(args.warmup + args.steps):
        src, tgt_in, tgt_out = (t.to(device) for t in load_batch(data, batches[i % len(batches)]))
        start = time.perf_counter()
        trainer.update([(src, tgt_in, tgt_out)])
        [result] = trainer.sync()
        elapsed = time.perf_counter() - start
        losses.append(result.loss)
        if i < args.warmup:
            continue
        seconds += elapsed
        n_src, n_tgt = int((src != 0).sum()), int((tgt_out != 0).sum())
        tgt_tokens += n_tgt
        all_tokens += n_src + n_tgt
        update_flops = train_flops(config.model, n_src, n_tgt, src.shape[1], tgt_out.shape[1], tgt_tok.vocab_size)
        flops += update_flops
        rates.append(update_flops / elapsed)
    return {
        "variant": variant,
        "tgt_tok_s": tgt_tokens / seconds,
        "all_tok_s": all_tokens / seconds,
        "flop_s": flops / seconds,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "loss_first": losses[0],
        "loss_last": sum(losses[-5:]) / len(losses[-5:]),
        "steps": args.steps,
        "median_flop_s": statistics.median(rates),  # of the updates' own FLOP/s
    }


def vs_bf16(flop_s: float, bf16_peak: float, fast: bool) -> str:
    return f"{100 * flop_s / bf16_peak:.0f}%" if fast else "n/a (bf16 emulated)"


def main() -> None:
    args = parse_args()
    if args.run is None:
        args.run = ROOT / "runs" / f"bench-{args.config.stem if args.config else 'ref'}"
    if args.one:
        print(json.dumps(run_one(args, args.one)))
        return
    prepare_data(args)
    set_threads(args.threads)
    cpu = torch.device("cpu")
    fast = fast_bf16_available(cpu)
    # at the size train.log's MFU is measured at (peak_size): 256² where bf16 is emulated (~1 GFLOP/s)
    peak = {p: matmul_peak_flops(PEAK_DTYPES[p], n=peak_size(cpu, p), repeats=20 if fast or p == "fp32" else 3)
            for p in ("fp32", "bf16")}  # fmt: skip
    print(
        f"# bench_train: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, native bf16: {fast}"
    )
    print(
        f"# matmul peak (this run): fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s (2048²), "
        f"bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s ({'2048²' if fast else '256², emulated'})"
    )
    shape = f"recipe {args.config}" if args.config else "reference shape, ~4096-token batches"
    print(f"# timed: {args.steps} updates after {args.warmup} warm-up updates; {shape}; CPU {cpu_model()}")
    print()
    print(
        "| variant | target tok/s | src+tgt tok/s | GFLOP/s | MFU (own precision) | median update MFU "
        "| MFU (vs bf16 peak) | peak RSS GiB | loss first → last |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for variant in args.variants.split(","):
        if variant.startswith("bf16") and not fast and not args.force_bf16:
            print(
                f"| {variant} | skipped: no native bf16 on this CPU (bf16 matmul peak "
                f"{peak['bf16'] / 1e9:.1f} GFLOP/s); --force-bf16 runs it | | | | | | | |",
                flush=True,
            )
            continue
        cmd = [sys.executable, __file__, "--run", str(args.run), "--one", variant, "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--threads", str(args.threads)]  # fmt: skip
        cmd += ["--config", str(args.config)] if args.config else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        own = peak["bf16" if variant.startswith("bf16") else "fp32"]
        print(
            f"| {variant} | {r['tgt_tok_s']:,.0f} | {r['all_tok_s']:,.0f} | {r['flop_s'] / 1e9:.1f} "
            f"| {100 * r['flop_s'] / own:.0f}% | {100 * r['median_flop_s'] / own:.1f}% "
            f"| {vs_bf16(r['flop_s'], peak['bf16'], fast)} | {r['rss_gib']:.2f} "
            f"| {r['loss_first']:.2f} → {r['loss_last']:.2f} |",
            flush=True,
        )
    print()
    print(
        "FLOPs per update = 3 × forward; forward = E·N_s(8D² + 4DF + 4SD) + L·[N_t(12D² + 4TD + 4SD + 4DF)"
        " + N_s·4D²] + N_t·2DV  (nmt/model/flops.py)"
    )


if __name__ == "__main__":
    main()

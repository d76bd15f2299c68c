#!/usr/bin/env python
"""Where training time goes on the CPU: torch.profiler over nmt's own training updates, by category.

Builds what `nmt train` builds for a config (`nmt.train.loop`: `TrainData`, `build_seeded`, `wrap`,
`Trainer`, the loop's batch feed), runs `--warmup` updates unprofiled, then `--steps` updates under
`torch.profiler` on real batches of a prepared run (`--run`: its bin/ and vocab/), and prints one
markdown table: each category's self CPU time per update and its share of the updates' wall time.

Categories (`categorise`, from the operator's name; an element-wise operator inside a named one,
e.g. the `aten::exp` of the label-smoothed loss's backward or the `aten::t` of `aten::linear`,
counts with it):

    matmul                       aten::mm / addmm / bmm / linear / matmul ...
    attention                    scaled_dot_product_attention and its kernels (forward, backward)
    softmax / cross-entropy      log_softmax, softmax, nll, the label-smoothed loss (the output projection's
                                 matmuls inside the fused loss count as matmuls)
    layer norm                   native_layer_norm and its backward
    dropout masks                bernoulli_, dropout, native_dropout (+ backward), nmt's CPU masks
    optimizer (AdamW + clip)     the fused AdamW step, zero_grad, clip_grad_norm_'s _foreach_ ops
    embedding / element-wise     every other aten:: operator (embedding, add, relu, copies ...)
    data (batch building)        wall time of building the update's batches, outside the model
    Python / framework overhead  the rest of the updates' wall time: Python between operators,
                                 autograd's own bookkeeping, the profiler's own cost

The shares are of the profiled wall time, so they sum to 100 %. The profiler adds a cost per
operator: the same number of updates is also timed unprofiled (unless --no-reference), and both
wall times are printed, so the overhead row can be read against it. The matmul and attention rows
also give the time their analytic FLOPs (`nmt.model.flops.train_flops`: real tokens, padded
lengths, as training counts them; attention = the S- and T-dependent terms) would take at the
matmul peak measured in this run (`matmul_peak_flops`, n×n matmuls in the training precision).

    python scripts/profile_train.py --run /path/to/prepared/run --steps 50 --threads 1
    python scripts/profile_train.py --run RUN --set model.ffn_dim=1024 --json profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.config import Config, load_config  # noqa: E402
from nmt.hw.device import bound_kernel_cache, fast_bf16_available, set_threads, training_precision  # noqa: E402
from nmt.hw.host import cpu_model  # noqa: E402
from nmt.model.flops import PEAK_DTYPES, matmul_peak_flops, train_flops  # noqa: E402

MATMUL = "matmul"
ATTENTION = "attention"
LOSS = "softmax / cross-entropy"
LAYER_NORM = "layer norm"
DROPOUT = "dropout masks"
OPTIMIZER = "optimizer (AdamW + clip)"
ELEMENTWISE = "embedding / element-wise"
DATA = "data (batch building)"
OVERHEAD = "Python / framework overhead"
CATEGORIES = (MATMUL, ATTENTION, LOSS, LAYER_NORM, DROPOUT, OPTIMIZER, ELEMENTWISE, DATA, OVERHEAD)
GENERIC = (ELEMENTWISE, OVERHEAD)  # categories an operator takes over from a named enclosing one

DATA_RANGE = "profile_train::data"  # the record_function around the batch feed
MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "addmv", "mv", "dot", "einsum", "_addmm_activation"}
)


def categorise(name: str) -> str:
    """The category (one of CATEGORIES) of a profiler event named `name`, by its name alone.

    aten:: operators by what they compute; the script's data range, torch.optim's
    ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` ranges and the label-smoothed loss's
    autograd node (``_SmoothedCrossEntropyBackward``) by what they enclose; anything else that is
    not an aten:: operator (autograd nodes, other ranges: their self time is Python and autograd
    bookkeeping) is overhead."""
    if name.startswith(DATA_RANGE):
        return DATA
    if name.startswith("Optimizer."):
        return OPTIMIZER
    if "SmoothedCrossEntropy" in name:  # the loss's autograd functions, plain and fused with the projection
        return LOSS
    if "_MaskedScale" in name:  # nmt.model.dropout's masks on the CPU
        return DROPOUT
    if not name.startswith("aten::"):
        return OVERHEAD
    op = name.removeprefix("aten::")
    if op in MATMUL_OPS:
        return MATMUL
    if "attention" in op:
        return ATTENTION
    if "softmax" in op or op.startswith(("nll_loss", "cross_entropy")):
        return LOSS
    if "layer_norm" in op:
        return LAYER_NORM
    if "dropout" in op or op.startswith("bernoulli"):
        return DROPOUT
    if "adam" in op or op.startswith("_foreach_"):
        return OPTIMIZER
    return ELEMENTWISE


def self_times(events: Iterable[FunctionEvent]) -> dict[str, float]:
    """Self CPU microseconds per category over profiler `events` (a whole tree, each event once).

    An event in a generic category (element-wise, overhead) counts with its nearest enclosing event
    of a specific category; events inside the data range are left out (data is timed by the wall
    clock around the batch feed)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    stack: list[tuple[FunctionEvent, str | None]] = [(e, None) for e in events if e.cpu_parent is None]
    while stack:
        event, inherited = stack.pop()
        own = categorise(event.name)
        if own == DATA:
            continue
        category = inherited if own in GENERIC and inherited is not None else own
        totals[category] += event.self_cpu_time_total
        passed = category if category not in GENERIC else None
        stack.extend((child, passed) for child in event.cpu_children)
    return totals


@dataclass
class Updates:
    """What a run of updates took: wall seconds in all and in batch building, analytic FLOPs."""

    wall: float = 0.0
    cpu: float = 0.0  # the process's CPU seconds (all threads): below wall × threads on a shared machine
    data: float = 0.0
    flops: float = 0.0  # train_flops of the batches
    dense_flops: float = 0.0  # the part without the attention scores and weighted sums (S, T terms)
    losses: list[float] = field(default_factory=list)


class Training:
    """nmt's training set-up for `config` on a prepared `run_dir`, on the CPU, as `nmt train`
    builds it (`nmt.train.loop._Run`), without checkpoints, validation or logging."""

    def __init__(self, config: Config, run_dir: Path) -> None:
        from nmt.train.distributed import DistInfo
        from nmt.train.loop import BatchFeed, TrainData, build_seeded, build_trainer

        self.config, self.device = config, torch.device("cpu")
        self.precision = training_precision(self.device, config.train.precision)
        self.data = TrainData.open(config, run_dir, self.device, DistInfo(), self.precision)
        self.vocab = self.data.vocab_sizes(config)
        self.model = build_seeded(config, self.vocab, self.device, None)
        self.trainer, _ = build_trainer(  # as the loop builds it: shared rows, guided alignment
            self.model, config, self.data, device=self.device, precision=self.precision, world_size=1
        )
        self.feed = BatchFeed(self.data, config.train.update_freq, self.trainer.state, self.device)

    def run(self, n: int) -> Updates:
        """`n` updates as the training loop issues them (batches from the feed, `Trainer.update`),
        each read back (`Trainer.sync`) so that its wall time is its own."""
        out = Updates()
        m, tgt_vocab = self.config.model, self.vocab[1]
        cpu_start = time.process_time()
        for _ in range(n):
            start = time.perf_counter()
            with record_function(DATA_RANGE):
                batches = self.feed.next(self.trainer.state)
            built = time.perf_counter()
            shapes = [(*b.real_tokens, b.src.size(1), b.tgt_out.size(1)) for b in batches]
            flops = sum(train_flops(m, *s, tgt_vocab) for s in shapes)
            self.trainer.update(batches, flops=flops)
            results = self.trainer.sync()
            out.wall += time.perf_counter() - start
            out.data += built - start
            out.flops += flops
            out.dense_flops += sum(train_flops(m, ns, nt, 0, 0, tgt_vocab) for ns, nt, _, _ in shapes)
            out.losses += [r.loss for r in results]
        out.cpu = time.process_time() - cpu_start
        return out

    def close(self) -> None:
        self.feed.close()


def table_rows(totals_us: dict[str, float], timed: Updates, steps: int, peak: float) -> list[dict]:
    """One row per category: ms per update, share of the wall time, and for matmul and attention
    the ms per update their analytic FLOPs would take at `peak` FLOP/s (None for the others).
    Data is the wall time of batch building; overhead is the wall time no operator accounts for."""
    ms = {c: totals_us[c] / 1e3 / steps for c in CATEGORIES}
    wall_ms = timed.wall * 1e3 / steps
    ms[DATA] = timed.data * 1e3 / steps
    ms[OVERHEAD] += wall_ms - sum(ms.values())  # autograd/range self time + time between operators
    at_peak = {
        MATMUL: timed.dense_flops / steps / peak * 1e3,
        ATTENTION: (timed.flops - timed.dense_flops) / steps / peak * 1e3,
    }
    return [
        {"category": c, "ms_per_update": ms[c], "share": ms[c] / wall_ms, "flops_at_peak_ms": at_peak.get(c)}
        for c in CATEGORIES
    ]


def format_table(rows: list[dict]) -> str:
    """The rows as a markdown table, with a total row."""
    lines = [
        "| category | self CPU ms / update | share | FLOPs at matmul peak, ms / update |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        ideal = "" if r["flops_at_peak_ms"] is None else f"{r['flops_at_peak_ms']:.1f}"
        lines.append(f"| {r['category']} | {r['ms_per_update']:.1f} | {100 * r['share']:.1f}% | {ideal} |")
    total = sum(r["ms_per_update"] for r in rows)
    ideal_total = sum(r["flops_at_peak_ms"] or 0.0 for r in rows)
    share = 100 * sum(r["share"] for r in rows)
    lines.append(f"| **total (wall)** | {total:.1f} | {share:.1f}% | {ideal_total:.1f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "small.yaml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    p.add_argument("--run", type=Path, default=None, help="prepared run (bin/, vocab/); default runs/<config name>")
    p.add_argument("--steps", type=int, default=50, help="profiled updates")
    p.add_argument("--warmup", type=int, default=5, help="unprofiled updates first (allocator, kernel choice)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: train.threads; 0 = all)")
    p.add_argument("--peak-size", type=int, default=2048, help="n of the n×n matmuls that measure the peak")
    p.add_argument("--no-reference", action="store_true", help="skip timing --steps more updates unprofiled")
    p.add_argument("--json", type=Path, default=None, help="also write the table and the run's facts here")
    return p.parse_args(argv)


def measure_peak(precision: str, n: int) -> float:
    """FLOP/s of n×n matmuls in `precision` on this CPU now (bf16 emulated: 256², it is slow)."""
    dtype = PEAK_DTYPES[precision]
    if dtype == torch.bfloat16 and not fast_bf16_available(torch.device("cpu")):
        return matmul_peak_flops(dtype, n=min(n, 256), repeats=3, device="cpu")
    return matmul_peak_flops(dtype, n=n, device="cpu")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bound_kernel_cache()
    config = load_config(args.config, args.set)
    run_dir = args.run if args.run is not None else ROOT / "runs" / config.name
    set_threads(config.train.threads if args.threads is None else args.threads)
    torch.manual_seed(config.train.seed)
    training = Training(config, run_dir)
    try:
        peak = measure_peak(training.precision, args.peak_size)
        training.run(args.warmup)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            timed = training.run(args.steps)
        reference = None if args.no_reference else training.run(args.steps)
    finally:
        training.close()
    rows = table_rows(self_times(prof.events()), timed, args.steps, peak)
    m = config.model
    facts = {
        "config": str(args.config),
        "overrides": args.set,
        "run": str(run_dir),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "precision": training.precision,
        "configured_precision": config.train.precision,
        "model": f"d{m.d_model} h{m.heads} {m.encoder_layers}+{m.decoder_layers} ffn{m.ffn_dim}",
        "vocab": list(training.vocab),
        "max_tokens": config.train.max_tokens,
        "warmup": args.warmup,
        "steps": args.steps,
        "peak_flops": peak,
        "peak_size": args.peak_size,
        "wall_ms_per_update": timed.wall * 1e3 / args.steps,
        "cpu_per_wall": timed.cpu / timed.wall,
        "mfu": timed.flops / timed.wall / peak,
        "unprofiled_wall_ms_per_update": reference.wall * 1e3 / args.steps if reference else None,
        "unprofiled_mfu": reference.flops / reference.wall / peak if reference else None,
        "loss_first_last": [timed.losses[0], timed.losses[-1]] if timed.losses else [],
        "rows": rows,
    }
    print(report(facts))
    if args.json is not None:
        args.json.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return 0


def report(f: dict) -> str:
    """The header lines (machine, model, precision, peak, MFU) and the table, for a terminal or docs."""
    over = f" {' '.join('--set ' + s for s in f['overrides'])}" if f["overrides"] else ""
    unprofiled = (
        f"; unprofiled {f['unprofiled_wall_ms_per_update']:.1f} ms/update, MFU {100 * f['unprofiled_mfu']:.1f}%"
        if f["unprofiled_wall_ms_per_update"] is not None
        else ""
    )
    lines = [
        f"# profile_train: {f['config']}{over} on {f['run']}",
        f"# CPU {f['cpu']}, torch {f['torch']}, {f['threads']} thread(s), precision {f['precision']}"
        f" (train.precision {f['configured_precision']})",
        f"# model {f['model']}, vocab {f['vocab'][0]}/{f['vocab'][1]}, max_tokens {f['max_tokens']};"
        f" {f['steps']} profiled updates after {f['warmup']} warm-up",
        f"# matmul peak {f['peak_flops'] / 1e9:.1f} GFLOP/s ({f['peak_size']}² {f['precision']}, this run)",
        f"# profiled {f['wall_ms_per_update']:.1f} ms/update, MFU {100 * f['mfu']:.1f}%{unprofiled}",
        f"# process CPU time / profiled wall time: {100 * f['cpu_per_wall']:.0f}%"
        " (under 100% × threads: the process waited for a core, e.g. on a shared machine)",
        "",
        format_table(f["rows"]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

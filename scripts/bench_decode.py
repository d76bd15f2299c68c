#!/usr/bin/env python
"""Decoding speed side by side: nmt's native engine against CTranslate2, same weights, same sentences.

One run, one table: native fp32 / bf16 / int8 and CTranslate2 float32 / int8 (the same checkpoint,
exported with nmt/export/ct2_model.py), greedy and beam search, each batch size, on a seeded subset of the
run's test split. Every row carries its BLEU, so that no speed-up silently costs quality, and its
ratio to CTranslate2 float32 at the same batch size and search — the headline, because absolute
figures move with the machine. Repetitions are interleaved (every engine once, then again) and
the best is kept, which evens out a machine shared with other work.

Time is wall time of `Translator.translate` (normalisation, tokenisation, batching, search,
detokenisation: the same text work for both engines). The CTranslate2 baseline is given whole
length-sorted batches (one `translate_batch` call per batch, the longest sentence's length
limit, outputs cut to each sentence's own limit), as a CTranslate2 user would call it;
`--ct2-engine` times nmt's own CTranslate2 engine instead.

    python scripts/bench_decode.py --run runs/small --threads 2
    python scripts/bench_decode.py --run runs/small --batches 64 --rows native:fp32,ctranslate2:fp32
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmt.decode.evaluate import read_lines, score  # noqa: E402
from nmt.decode.options import ALONE_ROWS, BATCH_ROWS  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.hw import host  # noqa: E402
from nmt.model.fast_decoder import FastDecoder  # noqa: E402
from nmt.run.checkpoints import find_inference_checkpoint  # noqa: E402
from nmt.run.layout import RunDir  # noqa: E402

ROWS = "native:fp32,native:bf16,native:int8,ctranslate2:fp32,ctranslate2:int8"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=Path("runs/small"))
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the run's inference checkpoint")
    p.add_argument("--sentences", type=int, default=2000, help="size of the seeded test subset")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--batch1-sentences", type=int, default=200, help="subset size at batch 1 (slow)")
    p.add_argument("--rows", default=ROWS, help="engine:precision pairs")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2, help="interleaved repetitions; the best is kept")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--export-dir", type=Path, default=None, help="CTranslate2 export (default: the run's cache)")
    p.add_argument("--ct2-engine", action="store_true", help="time nmt's CTranslate2 engine, not whole batches")
    p.add_argument("--breakdown", type=int, default=50, help="sentences for the batch-1 step breakdown (0: none)")
    p.add_argument("--cli-repeats", type=int, default=5, help="runs of `nmt translate` per engine (0: none)")
    return p.parse_args()


def subset(run: Path, n: int, seed: int) -> tuple[list[str], list[str]]:
    src = read_lines(RunDir(run).corpus_file("test", "zh"))
    ref = read_lines(RunDir(run).corpus_file("test", "en"))
    idx = sorted(random.Random(seed).sample(range(len(src)), min(n, len(src))))
    return [src[i] for i in idx], [ref[i] for i in idx]


def ct2_engine(args: argparse.Namespace, native: Translator, precision: str) -> object:
    """CTranslate2 on the same checkpoint (exported once by nmt/export/ct2_model.py), in `precision`."""
    from nmt.decode import ct2
    from nmt.export import ct2_model

    source = ct2_model.resolve_source(args.run, native.checkpoint)
    out = args.export_dir / native.checkpoint.stem if args.export_dir else None
    model_dir = ct2_model.ensure_export(source, out, None)
    cls = ct2.CTranslate2Engine if args.ct2_engine else _whole_batches(ct2.CTranslate2Engine)
    return cls(model_dir, native.config.decode, ct2.Ct2Device("cpu"), precision, args.threads)


def _whole_batches(base: type) -> type:
    class WholeBatches(base):  # type: ignore[misc, valid-type]
        """One translate_batch call per batch, at the longest sentence's limit."""

        def search(self, seqs, beam, nbest, len_penalty, greedy, on_done=None):  # noqa: ANN001, ANN202
            limits = [self.max_len(len(s)) for s in seqs]
            sources = [[self.src_pieces[t] for t in s] for s in seqs]
            results = self._translate(sources, max(limits), beam, len_penalty, greedy)
            return [
                [(self._ids(h)[:limit], float("nan")) for h in r.hypotheses]
                for r, limit in zip(results, limits, strict=True)
            ]

    return WholeBatches


def load(args: argparse.Namespace, rows: int, reuse: dict[str, Translator | str] | None = None) -> dict:
    """One Translator per row of `--rows` (or the reason it cannot run, as a string); native rows
    tuned for steps of `rows` rows (`InferenceOptions.rows`), CTranslate2 rows taken from `reuse`."""
    loaded: dict[str, Translator | str] = {}
    native = None
    for row in args.rows.split(","):
        engine, precision = row.split(":")
        if engine != "native" and reuse is not None:
            loaded[row] = reuse[row]
            continue
        try:
            if engine == "native":
                loaded[row] = Translator.from_run(
                    args.run, args.checkpoint, device="cpu", precision=precision, rows=rows
                )
                native = native or loaded[row]
            else:
                base = native or Translator.from_run(args.run, args.checkpoint, device="cpu", precision="fp32")
                eng = ct2_engine(args, base, precision)
                tokenizers = (base.src_tok, base.tgt_tok)
                loaded[row] = Translator(None, *tokenizers, base.config, checkpoint=base.checkpoint, engine=eng)
        except Exception as e:  # noqa: BLE001 - a row that cannot run is reported, the others go on
            loaded[row] = f"skipped: {str(e).splitlines()[0][:90]}"
    return loaded


def precision_of(tr: Translator) -> str:
    """The resolved precision, with the int8 kernel the native engine chose."""
    described = getattr(tr.engine, "describe", "")
    return described.removeprefix("native ") if described else tr.precision


def measure(tr: Translator, src: list[str], batch: int, beam: int) -> tuple[float, list[str]]:
    """Sentences per second (wall) and the outputs of one pass over `src`."""
    tr.config.decode.batch_size, tr.config.decode.max_tokens = batch, 1 << 30
    start = time.perf_counter()
    hyps = tr.translate(src, beam=beam)
    return len(src) / (time.perf_counter() - start), hyps


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    args.checkpoint = args.checkpoint or find_inference_checkpoint(args.run)
    src, ref = subset(args.run, args.sentences, args.seed)
    rows = load(args, BATCH_ROWS)
    alone = load(args, ALONE_ROWS, reuse=rows) if "1" in args.batches.split(",") else rows
    try:
        import ctranslate2

        ct2_version = ctranslate2.__version__
    except ImportError:
        ct2_version = "not installed"
    print(
        f"# bench_decode {time.strftime('%Y-%m-%d %H:%M')} | run={args.run} checkpoint={args.checkpoint.name} "
        f"| subset={len(src)} (batch 1: {min(len(src), args.batch1_sentences)}) seed={args.seed} "
        f"| threads={torch.get_num_threads()} | CPU: {host.current().describe()} | torch {torch.__version__}, "
        f"ctranslate2 {ct2_version} | best of {args.repeats} interleaved | "
        f"CTranslate2 baseline: {'nmt engine' if args.ct2_engine else 'whole batches'}"
    )
    for row, tr in rows.items():
        if isinstance(tr, str):
            print(f"# {row}: {tr}")
    tuned = {
        n: {row: tr for row, tr in found.items() if not isinstance(tr, str)} for n, found in ((64, rows), (1, alone))
    }

    for tr in {id(t): t for found in tuned.values() for t in found.values()}.values():
        tr.translate(src[:32], beam=args.beam)  # warm-up
    print("\n| batch | search | engine | precision | sentences/s | × CTranslate2 fp32 | BLEU |")
    print("|---:|---|---|---|---:|---:|---:|")
    for batch in (int(b) for b in args.batches.split(",")):
        n = min(len(src), args.batch1_sentences) if batch == 1 else len(src)
        live = tuned[1 if batch == 1 else 64]  # the native engine tuned for one sentence at a time at batch 1
        for search, beam in ((f"beam {args.beam}", args.beam), ("greedy", 1)):
            best: dict[str, float] = {}
            bleu: dict[str, float] = {}
            for _ in range(args.repeats):
                for row, tr in live.items():
                    speed, hyps = measure(tr, src[:n], batch, beam)
                    best[row] = max(best.get(row, 0.0), speed)
                    bleu.setdefault(row, score(hyps, ref[:n])["bleu"])
            base = best.get("ctranslate2:fp32")
            for row in live:
                engine, precision = row.split(":")
                ratio = f"{best[row] / base:.2f}" if base else "–"
                print(
                    f"| {batch} | {search} | {engine} | {precision_of(live[row])} | {best[row]:.1f} | {ratio} "
                    f"| {bleu[row]:.2f} |",
                    flush=True,
                )
    if args.breakdown:
        breakdown(tuned[1], src[: args.breakdown], args.beam)
    if args.cli_repeats:
        cli_latency(args)


class Clock:
    """Wall time and calls of wrapped methods, by label (instance attributes shadow the methods)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def wrap(self, obj: object, name: str, label: str) -> None:
        setattr(obj, name, self.timed(getattr(obj, name), label))

    def unwrap(self, obj: object, name: str) -> None:
        delattr(obj, name)

    def timed(self, fn: Callable, label: str) -> Callable:
        """`fn`, its wall time and calls counted under `label`."""

        def call(*a, **k):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        return call


def breakdown(live: dict[str, Translator], src: list[str], beam: int) -> None:
    """At batch 1: wall time per output token (every engine), and for the native engine its time
    per decoder step split into the step's linear layers, the rest of the step (attention,
    LayerNorms, residuals, the cache) and the search around it."""
    print(
        "\n| engine | precision | search | ms per output token | steps | step ms | of which linear layers "
        "| rest of the step | search bookkeeping ms | encoder ms/sentence |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row, tr in live.items():
        stepper = getattr(tr.engine, "stepper", None)
        native = isinstance(stepper, FastDecoder)
        for search, b in ((f"beam {beam}", beam), ("greedy", 1)):
            tr.config.decode.batch_size = 1
            clock = Clock()
            if native:
                saved = stepper.layers, stepper.logits
                timed = functools.partial(clock.timed, label="linear")
                stepper.layers = [
                    dataclasses.replace(w, **{k: timed(getattr(w, k)) for k in LINEARS}) for w in saved[0]
                ]
                stepper.logits = timed(stepper.logits)
                clock.wrap(stepper, "encode_by_length", "encode")
                clock.wrap(stepper, "decode_step", "step")
            start = time.perf_counter()
            hyps = tr.translate(src, beam=b)
            total = time.perf_counter() - start
            if native:
                stepper.layers, stepper.logits = saved
                clock.unwrap(stepper, "encode_by_length")
                clock.unwrap(stepper, "decode_step")
            tokens = sum(len(tr.tgt_tok.encode(h)) + 1 for h in hyps)
            cells = [row.split(":")[0], precision_of(tr), search, f"{1e3 * total / tokens:.3f}"]
            if native:
                steps, sec = clock.calls["step"], clock.seconds
                ms = [1e3 * sec[k] / steps for k in ("step", "linear")]
                rest = 1e3 * (total - sec["encode"] - sec["step"]) / steps
                cells += [str(steps), *(f"{m:.3f}" for m in ms), f"{ms[0] - ms[1]:.3f}", f"{rest:.3f}"]
                cells.append(f"{1e3 * sec['encode'] / len(src):.2f}")
            print("| " + " | ".join(cells + [""] * (10 - len(cells))) + " |", flush=True)


LINEARS = ("qkv", "self_out", "q", "cross_out", "fc1", "fc2")  # FastDecoder's bound linear layers


def cli_latency(args: argparse.Namespace) -> None:
    """Process start to output of `nmt translate "我爱 AI"`, p50 over interleaved repetitions. With
    compiled bytecode, as after an install: PYTHONDONTWRITEBYTECODE is dropped from the commands'
    environment, so the warm-up run writes nmt's `__pycache__` (with it set, every run recompiles
    nmt's sources, ~0.1 s here)."""
    py, text = sys.executable, "我爱 AI"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    nmt = [py, "-m", "nmt", "translate", "--run", str(args.run), text]
    commands = {
        "python -c pass": [py, "-c", "pass"],
        'python -c "import torch"': [py, "-c", "import torch"],
        "nmt translate --engine ctranslate2": [*nmt, "--engine", "ctranslate2"],
        "nmt translate --engine auto (the default)": nmt,
        "nmt translate --engine native (--precision auto)": [*nmt, "--engine", "native"],
        "nmt translate --engine native --precision fp32": [*nmt, "--engine", "native", "--precision", "fp32"],
    }
    for cmd in commands.values():  # warm the page cache and nmt's probe cache once
        subprocess.run(cmd, capture_output=True, check=True, env=env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.cli_repeats):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=env)
            times[name].append(time.perf_counter() - start)
    p50 = {name: statistics.median(t) for name, t in times.items()}
    torch_import = p50['python -c "import torch"']
    print(f"\n| command (p50 of {args.cli_repeats}) | seconds | over `import torch` |")
    print("|---|---:|---:|")
    for name, t in p50.items():
        over = f"{t - torch_import:+.2f}" if "--engine native" in name else ""
        print(f"| {name} | {t:.2f} | {over} |")


if __name__ == "__main__":
    main()

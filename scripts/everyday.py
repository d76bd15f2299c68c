"""A run's translations of the everyday sentences (data/everyday.zh, written for nmt with their
references in data/everyday.en), printed beside the references: what a reader wants to see of a
model besides its scores. `make demo` runs it after training.

    python scripts/everyday.py --run runs/small-mix [--engine native] [--beam 5]

Also writes <run>/eval/everyday.{hyp,json,md} (sacreBLEU over 30 lines: a sanity figure, not a
benchmark).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nmt.config import load_config
from nmt.decode.evaluate import EvalJob, evaluate_run
from nmt.decode.options import InferenceOptions
from nmt.errors import NmtError
from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ROOT / "data" / "everyday"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "latest")
    parser.add_argument("--sentences", type=Path, default=SENTENCES, help="STEM: STEM.zh and STEM.en")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--beam", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        run = args.run.resolve()
        config = load_config(RunDir(run).config)
        src, ref = args.sentences.with_suffix(".zh"), args.sentences.with_suffix(".en")
        opts = InferenceOptions(run_dir=run, engine=args.engine, beam=args.beam)
        report = evaluate_run(config, run, EvalJob(src=src, ref=ref, name="everyday"), opts, quiet=True)
    except NmtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    hyps = Path(report["hyp_file"]).read_text(encoding="utf-8").splitlines()
    table = Table(title=f"{run.name}: everyday sentences (BLEU {report['bleu']:.1f} over {len(hyps)} lines)")
    for column in ("source", "nmt", "reference"):
        table.add_column(column)
    sources, refs = src.read_text(encoding="utf-8").splitlines(), ref.read_text(encoding="utf-8").splitlines()
    for row in zip(sources, hyps, refs, strict=True):
        table.add_row(*row)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

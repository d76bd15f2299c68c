"""The raw path of trained runs (what exported runtimes do: no pass-through masks) on the span sets
of `scripts/span_sets.py`, as one table of the spans kept per set.

    python scripts/span_sets.py --out runs/spans
    python scripts/bench_raw_path.py --spans runs/spans runs/ablation/recipe runs/ablation/other

Each run is scored by `nmt eval --run RUN --engine native --no-passthrough` (the run's beam) on
every set, one run per core with one thread, as many at a time as there are cores; the reports
land in RUN/eval/spans-<set>.* (the output of `nmt eval` in RUN/eval/spans-raw-path.log) and the
table is read back from their JSON. `--no-eval` only prints the table of reports already there.
Decide on valid, news40, mirror and mirror-words; the test set is there to report, never to decide on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent
SETS = ("valid", "news40", "mirror", "mirror-words", "test")
PREFIX = "spans-"  # report names: never those of the run's own splits (eval/test.md)


def eval_command(run: Path, spans: Path) -> list[str]:
    """`nmt eval` of `run` on every span set, raw."""
    cmd = [sys.executable, "-m", "nmt", "eval", "--run", str(run), "--engine", "native", "--no-passthrough"]
    for name in SETS:
        cmd += ["--src", str(spans / f"{name}.zh"), "--ref", str(spans / f"{name}.en"), "--name", PREFIX + name]
    return cmd


def evaluate(runs: list[Path], spans: Path) -> None:
    """Score `runs`, one per core (one thread each), as many at a time as there are cores."""
    cores = sorted(os.sched_getaffinity(0))
    env = dict(os.environ) | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for start in range(0, len(runs), len(cores)):
        jobs = []
        for run, core in zip(runs[start : start + len(cores)], cores, strict=False):
            layout = RunDir(run)
            layout.eval.mkdir(parents=True, exist_ok=True)
            log = layout.eval_file(f"{PREFIX}raw-path", "log").open("w", encoding="utf-8")
            cmd = ["taskset", "-c", str(core), *eval_command(run, spans)]
            jobs.append((run, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)))
        for run, log, job in jobs:
            if job.wait():
                raise SystemExit(f"nmt eval failed for {run}: see {log.name}")
            log.close()


def kept(run: Path, name: str) -> dict | None:
    """The pass-through score of `run`'s report on span set `name` ({"spans", "kept",
    "accuracy"}), None where there is none."""
    report = RunDir(run).eval_report(PREFIX + name)
    if not report.is_file():
        return None
    return json.loads(report.read_text(encoding="utf-8")).get("passthrough")


def table(runs: list[Path]) -> str:
    """A markdown table: a row per run, a column per set, "kept% (kept / spans)"."""
    lines = ["| run | " + " | ".join(SETS) + " |", "|---|" + "---:|" * len(SETS)]
    for run in runs:
        cells = []
        for name in SETS:
            score = kept(run, name)
            cells.append(
                ""
                if not score or not score["spans"]
                else f"{score['accuracy']:.1%} ({score['kept']} / {score['spans']})"
            )
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--spans", type=Path, default=Path("runs/spans"), help="scripts/span_sets.py's --out")
    parser.add_argument("--no-eval", action="store_true", help="only print the table of the reports already there")
    args = parser.parse_args(argv)
    if not args.no_eval:
        missing = [f"{args.spans / n}.zh" for n in SETS if not (args.spans / f"{n}.zh").is_file()]
        if missing:
            parser.error(f"no span set {missing[0]}: run scripts/span_sets.py --out {args.spans}")
        evaluate(args.runs, args.spans)
    print(table(args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

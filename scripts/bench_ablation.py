"""Ablation at a time budget, on the validation split only: arms of config overrides trained side
by side, each pinned to its own CPU core with one thread, so that the arms of a round see the
same machine for the same minutes.

    python scripts/bench_ablation.py --arm baseline \\
        --arm budget=train.schedule=budget-linear \\
        --arm budget+ema=train.schedule=budget-linear,train.ema_decay=0.999 --budget 20m

The corpus and vocabularies are prepared once (all cores) and linked into every arm's run
directory; then the arms train (`nmt train`, `train.max_time` = BUDGET) in rounds of as many arms
as there are cores; then each arm's checkpoint is chosen on the validation split as `nmt
pipeline` chooses it (averaged or best, beam search on the whole split). The test split is never
decoded: the winner's test score is measured once, after the choice (`nmt eval --run ...`).
Prints one table, a row per arm; the results also go to WORK/ablation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent
PREPARED = ("corpus", "vocab", "bin", "download.stamp.json", "vocab.stamp.json")  # what the arms share


def parse_arm(text: str) -> tuple[str, list[str]]:
    """`NAME` or `NAME=section.key=value,section.key=value` → (name, overrides)."""
    name, _, rest = text.partition("=")
    if not name or "," in name or "." in name:
        raise argparse.ArgumentTypeError(f"--arm {text!r}: NAME or NAME=section.key=value[,...]")
    overrides = [o for o in rest.split(",") if o] if rest else []
    for o in overrides:
        if "=" not in o or "." not in o.split("=", 1)[0]:
            raise argparse.ArgumentTypeError(f"--arm {text!r}: {o!r} is not section.key=value")
    return name, overrides


def parse_arm_config(text: str) -> tuple[str, str]:
    """`NAME=CONFIG` → (name, config path)."""
    name, _, config = text.partition("=")
    if not name or not config:
        raise argparse.ArgumentTypeError(f"--arm-config {text!r}: NAME=CONFIG")
    return name, config


def prepared_dir(work: Path, config: str, default: str) -> Path:
    """Where `config`'s corpus and vocabularies are prepared: `prepared`, or for another config
    than --config's `prepared-<its stem>`."""
    return work / ("prepared" if config == default else f"prepared-{Path(config).stem}")


def nmt(args: list[str], log: Path, core: int | None = None) -> int:
    """`python -m nmt ARGS`, output appended to `log`; pinned to `core` with one thread when given."""
    cmd = [sys.executable, "-m", "nmt", *args]
    env = dict(os.environ)
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
        env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode


def prepare(config: str, base: Path, mirror: str | None, log: Path) -> None:
    """The corpus, vocabularies and encoded splits of `config`, once, in `base`."""
    where = ["--mirror", mirror] if mirror else []
    for stage in ("download", "vocab"):
        if nmt([stage, "--config", config, "--run", str(base), *(where if stage == "download" else [])], log):
            raise SystemExit(f"nmt {stage} failed: see {log}")


def link_prepared(base: Path, run: Path) -> None:
    """`base`'s prepared data in `run` (hard links: no copy of the corpus), unless already there."""
    run.mkdir(parents=True, exist_ok=True)
    for name in PREPARED:
        source, target = base / name, run / name
        if target.exists() or not source.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, target, copy_function=os.link)
        else:
            os.link(source, target)


def train_arm(config: str, run: Path, overrides: list[str], budget: str, core: int, log: Path) -> int:
    sets = [a for o in [*overrides, f"train.max_time={budget}", "train.threads=1"] for a in ("--set", o)]
    return nmt(["train", "--config", config, "--run", str(run), *sets], log, core)


def select(run: Path) -> dict:
    """The pipeline's checkpoint choice for `run` (validation only): {"chosen", "valid_bleu"}."""
    from nmt.config import load_config
    from nmt.pipeline import select_stage

    select_stage(load_config(RunDir(run).config), run)
    return json.loads(RunDir(run).stamp("select").read_text(encoding="utf-8"))


def from_log(run: Path) -> dict:
    """What the run's train.log says of its training (`nmt train` writes no stamp; the pipeline
    does): updates, epochs, mean tokens/s, the last learning rate, the best greedy validation
    BLEU during training and its step."""
    steps, rates, lr, epochs, best, best_step = 0, [], None, 0.0, 0.0, 0
    for line in RunDir(run).train_log.read_text(encoding="utf-8").splitlines():
        fields = dict(f.strip().split(" ", 1) for f in line.split(" | ")[1:] if " " in f.strip())
        if " step " in line and "lr" in fields and "valid step" not in line:
            steps = int(line.split(" step ")[1].split(" |")[0])
            lr, epochs = float(fields["lr"]), float(fields.get("epoch", epochs))
            rates.append(float(fields["tokens_per_s"]))
        elif "valid step" in line and " | best bleu " in line:
            value, _, at = line.split(" | best bleu ")[1].partition(" @ ")
            best, best_step = float(value), int(at)
        elif " stopped: " in line and " at step " in line:
            steps = int(line.split(" at step ")[1].split(" ")[0])
    return {
        "updates": steps,
        "epochs": epochs,
        "tokens_per_s": sum(rates) / max(len(rates), 1),
        "last_lr": lr,
        "best_greedy": best,
        "best_step": best_step,
    }


def result(name: str, overrides: list[str], run: Path) -> dict:
    chosen = select(run)
    return {
        "arm": name,
        "overrides": overrides,
        **from_log(run),
        "chosen": chosen["chosen"],
        "valid_bleu": chosen["valid_bleu"][chosen["chosen"]],
    }


def _log_text(run: Path) -> str:
    log = RunDir(run).train_log
    return log.read_text(encoding="utf-8") if log.is_file() else ""


def table(rows: list[dict]) -> str:
    head = (
        f"{'arm':<16}{'updates':>8}{'epochs':>7}{'tok/s':>7}{'last lr':>10}"
        f"{'greedy@300 (step)':>19}{'chosen':>10}{'valid BLEU':>11}  overrides"
    )
    lines = [head]
    for r in rows:
        best = f"{r['best_greedy']:.2f} ({r['best_step']})"
        lines.append(
            f"{r['arm']:<16}{r['updates']:>8}{r['epochs']:>7.2f}{r['tokens_per_s']:>7.0f}{r['last_lr'] or 0:>10.2e}"
            f"{best:>19}{r['chosen']:>10}{r['valid_bleu']:>11.2f}  {','.join(r['overrides']) or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", type=parse_arm, action="append", required=True, help="NAME[=key=value,...]")
    parser.add_argument("--config", default="configs/small.yaml")
    parser.add_argument(
        "--arm-config",
        type=parse_arm_config,
        action="append",
        default=[],
        help="NAME=CONFIG: that arm trains CONFIG instead of --config (its own corpus, prepared once)",
    )
    parser.add_argument("--budget", default="20m", help="train.max_time of every arm")
    parser.add_argument("--mirror", default=os.environ.get("NMT_MIRROR") or str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "ablation")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.arm]
    if len(set(names)) != len(names):
        parser.error(f"--arm names must differ: {names}")
    configs = {name: args.config for name in names} | dict(args.arm_config)
    if unknown := sorted(set(configs) - set(names)):
        parser.error(f"--arm-config names no --arm: {', '.join(unknown)}")
    cores = sorted(os.sched_getaffinity(0))
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "ablation.log"
    from nmt.hw.host import cpu_model

    print(f"CPU: {cpu_model()}; {len(cores)} cores, one arm per core; budget {args.budget}; log {log}", flush=True)
    for config in dict.fromkeys(configs.values()):
        prepare(config, prepared_dir(args.work, config, args.config), args.mirror, log)
    for name, _ in args.arm:
        link_prepared(prepared_dir(args.work, configs[name], args.config), args.work / name)
    todo = [arm for arm in args.arm if " stopped: " not in _log_text(args.work / arm[0])]  # trained before: kept
    for start in range(0, len(todo), len(cores)):
        round_ = todo[start : start + len(cores)]
        began = time.time()
        with ThreadPoolExecutor(len(round_)) as pool:
            jobs = [
                pool.submit(
                    train_arm, configs[name], args.work / name, sets, args.budget, core, args.work / f"{name}.log"
                )
                for (name, sets), core in zip(round_, cores, strict=False)
            ]
            failed = [name for (name, _), job in zip(round_, jobs, strict=True) if job.result()]
        if failed:
            raise SystemExit(f"training failed for {failed}: see {args.work}/<arm>.log")
        print(f"trained {[n for n, _ in round_]} side by side in {time.time() - began:.0f} s", flush=True)
    rows = [result(name, sets, args.work / name) for name, sets in args.arm]
    (args.work / "ablation.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

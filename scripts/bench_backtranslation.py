"""Back-translation recipe vs plain training, side by side at the same total wall time.

Two arms run at the same time, each pinned to its own CPU core (one thread each), so both
see the same machine for the same minutes:

- plain:  configs/small.yaml trained for the whole budget (train.max_time = BUDGET).
- recipe: configs/small-enzh.yaml trained for REVERSE minutes → `nmt backtranslate` of the
  monolingual English → configs/small-bt.yaml trained for whatever is left of BUDGET. Every
  second of the recipe counts (download, vocab, reverse training, export, back-translation).

Afterwards (outside the budget, still one core per arm) both forward runs go through
`nmt pipeline` (checkpoint chosen on validation, then the Tatoeba test) and newstest2018; the
reverse run is scored en→zh on its test. Prints one table; docs/BENCHMARKS.md keeps the figures.

    python scripts/bench_backtranslation.py --budget 45 --reverse 10
    python scripts/bench_backtranslation.py --budget 2 --reverse 0.5 --mono-lines 300   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def nmt(core: int | None, *args: str, log: Path) -> None:
    """Run `python -m nmt ARGS` pinned to one core with one thread; output appended to `log`."""
    cmd = [sys.executable, "-m", "nmt", *args]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") if core is not None else None
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def plain_arm(a: argparse.Namespace, core: int | None) -> dict:
    run = a.out / "plain"
    nmt(
        core,
        "pipeline",
        "-c",
        "configs/small.yaml",
        "-r",
        str(run),
        "--mirror",
        a.mirror,
        "-s",
        f"train.max_time={a.budget}m",
        log=a.out / "plain.log",
    )
    return {"run": run}


def recipe_arm(a: argparse.Namespace, core: int | None) -> dict:
    start, rev, bt = time.monotonic(), a.out / "enzh", a.out / "bt"
    log = a.out / "recipe.log"
    common = ["-c", "configs/small-enzh.yaml", "-r", str(rev)]
    nmt(core, "download", *common, "--mirror", a.mirror, log=log)
    nmt(core, "vocab", *common, log=log)
    nmt(core, "train", *common, "-s", f"train.max_time={a.reverse * 60:.0f}s", log=log)
    mono = Path(a.mirror) / "tatoeba-mono-en" / "train.en"
    if a.mono_lines:
        lines = mono.read_text(encoding="utf-8").splitlines()[: a.mono_lines]
        mono = a.out / "mono.en"
        mono.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bt_start = time.monotonic()
    bt_args = ["--engine", a.bt_engine, "--precision", a.bt_precision, "--beam", str(a.bt_beam)]
    nmt(core, "backtranslate", "-r", str(rev), "--mono", str(mono), "-o", str(bt), *bt_args, log=log)
    bt_seconds = time.monotonic() - bt_start
    left = a.budget * 60 - (time.monotonic() - start)
    fwd = a.out / "bt-forward"
    nmt(
        core,
        "pipeline",
        "-c",
        "configs/small-bt.yaml",
        "-r",
        str(fwd),
        "--mirror",
        a.mirror,
        "-s",
        f"data.backtranslation.corpus={bt}",
        "-s",
        f"train.max_time={left:.0f}s",
        log=log,
    )
    nmt(core, "pipeline", "-r", str(rev), "--mirror", a.mirror, log=log)  # select + en→zh test, after the budget
    n_mono = sum(1 for _ in mono.open(encoding="utf-8"))
    return {"run": fwd, "reverse": rev, "bt_seconds": bt_seconds, "mono": n_mono, "forward_seconds": left}


def newstest(a: argparse.Namespace, run: Path, core: int | None, log: Path) -> dict:
    """Score `run` on newstest2018 (zh→en); returns its report."""
    src, ref = a.out / "newstest2018.zh", a.out / "newstest2018.en"
    nmt(core, "eval", "-r", str(run), "--src", str(src), "--ref", str(ref), "--name", "newstest2018", log=log)
    return json.loads((run / "eval" / "newstest2018.json").read_text())


def write_newstest(a: argparse.Namespace) -> None:
    rows = [json.loads(x)["translation"] for x in (Path(a.mirror) / "wmt-news-zh-en" / "test.jsonl").open()]
    for lang in ("zh", "en"):
        (a.out / f"newstest2018.{lang}").write_text("".join(r[lang] + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=45.0, help="minutes of wall time per arm")
    p.add_argument("--reverse", type=float, default=10.0, help="minutes of reverse-model training")
    p.add_argument("--mirror", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-bt")
    p.add_argument("--mono-lines", type=int, default=0, help="back-translate only the first N lines")
    p.add_argument("--bt-engine", default="ctranslate2")
    p.add_argument("--bt-precision", default="int8")
    p.add_argument("--bt-beam", type=int, default=1)
    p.add_argument("--no-pin", action="store_true", help="do not pin each arm to one core")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    write_newstest(a)
    cores = (None, None) if a.no_pin else (0, 1)
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(plain_arm, a, cores[0]), pool.submit(recipe_arm, a, cores[1])]
        plain, recipe = (j.result() for j in jobs)
    with ThreadPoolExecutor(2) as pool:
        news = list(
            pool.map(
                lambda ac: newstest(a, ac[0]["run"], ac[1], a.out / "eval.log"), [(plain, cores[0]), (recipe, cores[1])]
            )
        )
    print_table(a, plain, recipe, news)


def print_table(a: argparse.Namespace, plain: dict, recipe: dict, news: list[dict]) -> None:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    print(f"\n{cpu}, one core per arm, budget {a.budget:g} min per arm")
    print(
        f"back-translation: {recipe['mono']} sentences in {recipe['bt_seconds']:.0f} s "
        f"({recipe['mono'] / recipe['bt_seconds']:.1f} sentences/s, {a.bt_engine} {a.bt_precision}, "
        f"beam {a.bt_beam}); forward training {recipe['forward_seconds'] / 60:.1f} min"
    )
    print("| arm | Tatoeba all BLEU | chrF | cmn_Hans | cmn_Hant | newstest2018 BLEU | chrF |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, arm, nt in (("plain", plain, news[0]), ("back-translation", recipe, news[1])):
        t = json.loads((arm["run"] / "eval" / "test.json").read_text())
        codes = t.get("by_code", {})
        hans, hant = (codes.get(c, {}).get("bleu", float("nan")) for c in ("cmn_Hans", "cmn_Hant"))
        print(
            f"| {name} | {t['bleu']:.2f} | {t['chrf']:.2f} | {hans:.2f} | {hant:.2f} | "
            f"{nt['bleu']:.2f} | {nt['chrf']:.2f} |"
        )
    rev = json.loads((recipe["reverse"] / "eval" / "test.json").read_text())
    print(f"reverse en→zh (Tatoeba test): BLEU {rev['bleu']:.2f} ({rev['bleu_signature']}), chrF {rev['chrf']:.2f}")


if __name__ == "__main__":
    main()

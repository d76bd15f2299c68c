"""Back-translation recipe vs plain training, side by side at the same total wall time.

Two arms run at the same time, each pinned to its own CPU core (one thread each), so both
see the same machine for the same minutes:

- plain:  configs/small.yaml trained for the whole budget (train.max_time = BUDGET).
- recipe: configs/small-enzh.yaml trained for REVERSE minutes → `nmt backtranslate` of the
  monolingual English → configs/small-bt.yaml trained for whatever is left of BUDGET. Every
  second of the recipe counts (download, vocab, reverse training, back-translation).
  If `nmt backtranslate` refuses the reverse model (its validation BLEU is below
  --min-valid-bleu), the recipe trains configs/small.yaml for the time left, as a user would.
- cached: a reverse model trained before (--reverse-run DIR, or the recipe's own with
  --cached-too): its back-translation is made before the clock starts and only the forward
  training is counted (configs/small-bt.yaml for the whole budget): what the recipe costs once
  a reverse model exists.

With --reverse-run the second arm is the cached one (plain ‖ cached); otherwise plain ‖ recipe,
then, with --cached-too, the cached arm on the recipe's reverse model alone (one more budget).
`--arms` names the arms to run instead (two at a time, in the order given): `--arms recipe`
runs the recipe alone, `--arms cached` reuses the reverse model of an earlier recipe in OUT.
Afterwards (outside the budget, one core per arm) every forward run goes through `nmt pipeline`
(checkpoint chosen on validation, then the Tatoeba test) and newstest2018. Prints one table with
a row per arm; docs/BENCHMARKS.md keeps the figures.

    python scripts/bench_backtranslation.py --budget 40 --reverse 15 --cached-too
    python scripts/bench_backtranslation.py --budget 40 --reverse-run runs/small-enzh
    python scripts/bench_backtranslation.py --budget 40 --reverse 15 --arms recipe
    python scripts/bench_backtranslation.py --budget 2 --reverse 0.5 --mono-lines 300 --min-valid-bleu 0  # smoke
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

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("plain", "recipe", "cached")
REFUSED = "is below the floor"  # how `nmt backtranslate` says a reverse model is too weak


def nmt(core: int | None, *args: str, log: Path, check: bool = True) -> int:
    """Run `python -m nmt ARGS` pinned to one core with one thread; output appended to `log`.
    Returns the exit status (an error unless `check` is False)."""
    cmd = [sys.executable, "-m", "nmt", *args]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") if core is not None else None
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, check=check, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode


def forward(a: argparse.Namespace, core: int | None, run: Path, seconds: float, log: Path, bt: Path | None) -> None:
    """`nmt pipeline` of the forward model for `seconds` of training: configs/small-bt.yaml on
    the synthetic pairs of `bt`, or configs/small.yaml when `bt` is None."""
    config = (
        ["-c", "configs/small-bt.yaml", "-s", f"data.backtranslation.corpus={bt}"]
        if bt
        else ["-c", "configs/small.yaml"]
    )
    nmt(
        core, "pipeline", *config, "-r", str(run), "--mirror", a.mirror, "-s", f"train.max_time={seconds:.0f}s", log=log
    )


def plain_arm(a: argparse.Namespace, core: int | None) -> dict:
    run = a.out / "plain"
    forward(a, core, run, a.budget * 60, a.out / "plain.log", None)
    return {"name": "plain", "run": run, "note": f"{a.budget:g} min of training"}


def mono_text(a: argparse.Namespace) -> Path:
    """The monolingual English to back-translate (its first --mono-lines lines when given)."""
    mono = Path(a.mirror) / "tatoeba-mono-en" / "train.en"
    if a.mono_lines:
        lines = mono.read_text(encoding="utf-8").splitlines()[: a.mono_lines]
        mono = a.out / "mono.en"
        mono.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return mono


def backtranslate(a: argparse.Namespace, core: int | None, reverse: Path, bt: Path, log: Path) -> dict:
    """`nmt backtranslate` of the mono text with `reverse`'s model into `bt`: its seconds and
    sentences, and whether the reverse model was refused (then `bt` is not written)."""
    mono, start = mono_text(a), time.monotonic()
    args = ["--engine", a.bt_engine, "--precision", a.bt_precision, "--beam", str(a.bt_beam)]
    args += ["--no-repeat-ngram", str(a.no_repeat_ngram), "--min-valid-bleu", str(a.min_valid_bleu)]
    status = nmt(
        core, "backtranslate", "-r", str(reverse), "--mono", str(mono), "-o", str(bt), *args, log=log, check=False
    )
    refused = status != 0 and any(REFUSED in line for line in log.read_text(encoding="utf-8").splitlines()[-3:])
    if status != 0 and not refused:
        raise SystemExit(f"nmt backtranslate failed (exit {status}): see {log}")
    n_mono = sum(1 for _ in mono.open(encoding="utf-8"))
    return {"bt_seconds": time.monotonic() - start, "mono": n_mono, "refused": refused}


def recipe_arm(a: argparse.Namespace, core: int | None) -> dict:
    start, rev, bt = time.monotonic(), a.out / "enzh", a.out / "bt"
    log = a.out / "recipe.log"
    common = ["-c", "configs/small-enzh.yaml", "-r", str(rev)]
    nmt(core, "download", *common, "--mirror", a.mirror, log=log)
    nmt(core, "vocab", *common, log=log)
    nmt(core, "train", *common, "-s", f"train.max_time={a.reverse * 60:.0f}s", log=log)
    made = backtranslate(a, core, rev, bt, log)
    left = max(a.budget * 60 - (time.monotonic() - start), 1.0)  # at least a second: 0 would mean no limit
    forward(a, core, a.out / "bt-forward", left, log, None if made["refused"] else bt)
    nmt(core, "pipeline", "-r", str(rev), "--mirror", a.mirror, log=log)  # select + en→zh test, after the budget
    note = f"reverse {a.reverse:g} min, forward {left / 60:.1f} min" + (
        " (reverse refused: plain)" if made["refused"] else ""
    )
    return {"name": "back-translation", "run": a.out / "bt-forward", "reverse": rev, "bt": bt, "note": note, **made}


def cached_arm(a: argparse.Namespace, core: int | None, reverse: Path, bt: Path) -> dict:
    """Forward training for the whole budget on the synthetic pairs of an existing reverse model
    (back-translated first, outside the budget; `nmt backtranslate` skips a finished output)."""
    log = a.out / "cached.log"
    made = backtranslate(a, core, reverse, bt, log)
    if made["refused"]:
        return {"name": "back-translation, cached reverse", "run": None, "note": "reverse refused", **made}
    run = a.out / "bt-cached"
    forward(a, core, run, a.budget * 60, log, bt)
    note = f"forward {a.budget:g} min; back-translation {made['bt_seconds'] / 60:.1f} min not counted"
    return {"name": "back-translation, cached reverse", "run": run, "reverse": reverse, "bt": bt, "note": note, **made}


def newstest(a: argparse.Namespace, run: Path, core: int | None, log: Path) -> dict:
    """Score `run` on newstest2018 (zh→en); returns its report."""
    src, ref = a.out / "newstest2018.zh", a.out / "newstest2018.en"
    nmt(core, "eval", "-r", str(run), "--src", str(src), "--ref", str(ref), "--name", "newstest2018", log=log)
    return json.loads(RunDir(run).eval_report("newstest2018").read_text())


def write_newstest(a: argparse.Namespace) -> None:
    rows = [json.loads(x)["translation"] for x in (Path(a.mirror) / "wmt-news-zh-en" / "test.jsonl").open()]
    for lang in ("zh", "en"):
        (a.out / f"newstest2018.{lang}").write_text("".join(r[lang] + "\n" for r in rows), encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=40.0, help="minutes of wall time per arm")
    p.add_argument("--reverse", type=float, default=15.0, help="minutes of reverse-model training (recipe arm)")
    p.add_argument("--reverse-run", type=Path, help="a trained en→zh run: the second arm reuses it (cached arm)")
    p.add_argument("--cached-too", action="store_true", help="then run the cached arm on the recipe's reverse model")
    p.add_argument("--mirror", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-bt")
    p.add_argument("--mono-lines", type=int, default=0, help="back-translate only the first N lines")
    p.add_argument("--bt-engine", default="ctranslate2")
    p.add_argument("--bt-precision", default="int8")
    p.add_argument("--bt-beam", type=int, default=1)
    p.add_argument("--no-repeat-ngram", type=int, default=3, help="nmt backtranslate --no-repeat-ngram")
    p.add_argument("--min-valid-bleu", type=float, default=10.0, help="nmt backtranslate --min-valid-bleu")
    p.add_argument("--no-pin", action="store_true", help="do not pin each arm to one core")
    p.add_argument("--arms", type=arm_list, help=f"the arms to run, comma-separated ({', '.join(ARMS)})")
    a = p.parse_args(argv)
    if a.reverse_run is not None and not RunDir(a.reverse_run).config.is_file():
        p.error(f"--reverse-run {a.reverse_run}: not a run directory (no config.yaml)")
    if a.reverse_run is not None and a.cached_too:
        p.error("--cached-too reuses the recipe's reverse model; --reverse-run already makes the second arm cached")
    if a.arms is not None and a.cached_too:
        p.error("--cached-too and --arms: name the cached arm in --arms instead")
    if a.arms is None:
        a.arms = ["plain", "cached" if a.reverse_run else "recipe"] + (["cached"] if a.cached_too else [])
    if "cached" in a.arms and a.reverse_run is None:  # the recipe's reverse model: this run's or an earlier one's
        if "recipe" not in a.arms and not (a.out / "enzh" / "config.yaml").is_file():
            p.error(f"--arms cached needs --reverse-run or a recipe's reverse model in {a.out / 'enzh'} (none there)")
        a.reverse_run = a.out / "enzh"
    return a


def arm_list(text: str) -> list[str]:
    """`plain,recipe` → ["plain", "recipe"]: known names, each once."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of distinct arms from {', '.join(ARMS)}")
    return names


def run_arms(a: argparse.Namespace) -> list[dict]:
    """The arms of `a.arms`, two at a time on cores 0 and 1 (see the module docstring); a cached
    arm that needs this run's recipe waits for it and then runs alone."""
    cores = (None, None) if a.no_pin else (0, 1)
    after_recipe = "cached" in a.arms and "recipe" in a.arms and a.reverse_run == a.out / "enzh"
    first = [name for name in a.arms if not (after_recipe and name == "cached")]
    done: dict[str, dict] = {}
    for i in range(0, len(first), 2):
        pair = first[i : i + 2]
        with ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(start_arm, a, name, core) for name, core in zip(pair, cores[: len(pair)], strict=True)]
            done |= {name: job.result() for name, job in zip(pair, jobs, strict=True)}
    if after_recipe:
        done["cached"] = start_arm(a, "cached", cores[0])
    arms = [done[name] for name in a.arms]
    with ThreadPoolExecutor(2) as pool:
        scored = [arm for arm in arms if arm["run"] is not None]
        core_of = [cores[i % 2] for i in range(len(scored))]
        pairs = list(zip(scored, core_of, strict=True))
        news = pool.map(lambda ac: newstest(a, ac[0]["run"], ac[1], a.out / "eval.log"), pairs)
        for arm, report in zip(scored, news, strict=True):
            arm["newstest"] = report
    return arms


def start_arm(a: argparse.Namespace, name: str, core: int | None) -> dict:
    """Run the arm called `name` on `core` (a cached arm on --reverse-run's model; on an earlier
    recipe's, its back-translation is reused)."""
    if name == "plain":
        return plain_arm(a, core)
    if name == "recipe":
        return recipe_arm(a, core)
    corpus = a.out / ("bt" if a.reverse_run == a.out / "enzh" else "bt-cached-corpus")
    return cached_arm(a, core, a.reverse_run, corpus)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    write_newstest(a)
    print_table(a, run_arms(a))


def print_table(a: argparse.Namespace, arms: list[dict]) -> None:
    """One row per arm (Tatoeba test by script, newstest2018) and a line per reverse model."""
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    print(f"\n{cpu}, one core per arm, budget {a.budget:g} min per arm")
    for arm in arms:
        if "mono" in arm:
            print(
                f"{arm['name']}: back-translation of {arm['mono']} sentences in {arm['bt_seconds']:.0f} s "
                f"({arm['mono'] / max(arm['bt_seconds'], 1e-9):.1f} sentences/s, {a.bt_engine} {a.bt_precision}, "
                f"beam {a.bt_beam}, no_repeat_ngram {a.no_repeat_ngram})"
            )
    print("| arm | time | Tatoeba all BLEU | chrF | cmn_Hans | cmn_Hant | newstest2018 BLEU | chrF |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for arm in arms:
        if arm["run"] is None:
            print(f"| {arm['name']} | {arm['note']} | – | – | – | – | – | – |")
            continue
        t, nt = json.loads((arm["run"] / "eval" / "test.json").read_text()), arm["newstest"]
        codes = t.get("by_code", {})
        hans, hant = (codes.get(c, {}).get("bleu", float("nan")) for c in ("cmn_Hans", "cmn_Hant"))
        print(
            f"| {arm['name']} | {arm['note']} | {t['bleu']:.2f} | {t['chrf']:.2f} | {hans:.2f} | {hant:.2f} | "
            f"{nt['bleu']:.2f} | {nt['chrf']:.2f} |"
        )
    for reverse in dict.fromkeys(arm["reverse"] for arm in arms if arm.get("reverse")):
        test = reverse / "eval" / "test.json"
        if test.is_file():
            rev = json.loads(test.read_text())
            print(
                f"reverse {reverse} en→zh (Tatoeba test): BLEU {rev['bleu']:.2f} ({rev['bleu_signature']}), "
                f"chrF {rev['chrf']:.2f}"
            )


if __name__ == "__main__":
    main()

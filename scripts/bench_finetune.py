"""Fine-tuning example with numbers: a Tatoeba model, fine-tuned on news, scored on newstest2018
before and after.

Builds a mirror from ../shared/data/wmt-news-zh-en: train = the first --train-lines pairs of
newsdev2017, validation = the rest of newsdev2017 (where the checkpoint is chosen), test = the
first --test-lines pairs of newstest2018. Then `nmt eval` of the initial model on that test,
`nmt pipeline -c configs/news.yaml --set train.init_from=INIT` (vocabularies copied from the
initial run, fresh optimizer and schedule) and the same test on the result. Prints one table.

    python scripts/bench_finetune.py --init runs/small/checkpoints/final.safetensors --minutes 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from nmt.run.layout import RunDir

ROOT = Path(__file__).resolve().parent.parent


def nmt(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "nmt", *args], check=True, cwd=ROOT)


def build_mirror(source: Path, out: Path, train_lines: int, test_lines: int) -> Path:
    """out/wmt-news-zh-en/{train,validation,test}.jsonl; returns the test source/reference prefix."""
    dev = (source / "wmt-news-zh-en" / "validation.jsonl").read_text(encoding="utf-8").splitlines()
    test = (source / "wmt-news-zh-en" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    test = test[:test_lines] if test_lines else test
    folder = out / "wmt-news-zh-en"
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", dev[:train_lines]), ("validation", dev[train_lines:]), ("test", test)):
        (folder / f"{name}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = [json.loads(row)["translation"] for row in test]
    for lang in ("zh", "en"):
        (out / f"newstest2018.{lang}").write_text("".join(p[lang] + "\n" for p in pairs), encoding="utf-8")
    return out / "newstest2018"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", type=Path, required=True, help="checkpoint of a zh-en Tatoeba run")
    p.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-ft")
    p.add_argument("--minutes", type=float, default=5.0, help="train.max_time of the fine-tuning")
    p.add_argument("--train-lines", type=int, default=1500)
    p.add_argument("--test-lines", type=int, default=1000, help="0: all of newstest2018")
    a = p.parse_args()
    test = build_mirror(a.mirror, a.out / "mirror", a.train_lines, a.test_lines)
    init_run = a.init.resolve().parent.parent
    src, ref = f"{test}.zh", f"{test}.en"
    nmt("eval", "-r", str(init_run), "--checkpoint", str(a.init), "--src", src, "--ref", ref, "--name", "ft-before")
    before = json.loads(RunDir(init_run).eval_report("ft-before").read_text())
    run = a.out / "run"
    start = time.monotonic()
    nmt(
        "pipeline",
        "-c",
        "configs/news.yaml",
        "-r",
        str(run),
        "--mirror",
        str(a.out / "mirror"),
        "-s",
        f"train.init_from={a.init.resolve()}",
        "-s",
        f"train.max_time={a.minutes * 60:.0f}s",
    )
    seconds = time.monotonic() - start
    nmt("eval", "-r", str(run), "--src", src, "--ref", ref, "--name", "ft-after")  # the same text as before
    after = json.loads(RunDir(run).eval_report("ft-after").read_text())
    print(
        f"\nfine-tuning {a.init} on newsdev2017[:{a.train_lines}] for train.max_time={a.minutes:g} min "
        f"(pipeline {seconds / 60:.1f} min); newstest2018, first {a.test_lines or 'all'} sentences, beam 5"
    )
    print("| model | BLEU | chrF |\n|---|---:|---:|")
    for name, r in (("Tatoeba model", before), ("fine-tuned on news", after)):
        print(f"| {name} | {r['bleu']:.2f} | {r['chrf']:.2f} |")


if __name__ == "__main__":
    main()

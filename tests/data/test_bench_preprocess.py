"""scripts/bench_preprocess.py: the corpora it makes and the memory it reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_preprocess", ROOT / "scripts" / "bench_preprocess.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def test_a_made_corpus_joins_source_pairs_and_keeps_the_eval_splits(mini_mirror, tmp_path):
    out = bench.make_corpus(500, mini_mirror, tmp_path / "m", seed=3)
    rows = [json.loads(line)["translation"] for line in (out / "tatoeba-zh-en" / "train.jsonl").open()]
    source = [json.loads(line)["translation"] for line in (mini_mirror / "tatoeba-zh-en" / "train.jsonl").open()]
    assert len(rows) == 500
    singles = {r["en"] for r in source}
    assert any(r["en"] in singles for r in rows) and any(r["en"] not in singles for r in rows)  # 1 and 2-3 joined
    for split in ("validation.jsonl", "test.jsonl"):
        assert (out / "tatoeba-zh-en" / split).read_bytes() == (mini_mirror / "tatoeba-zh-en" / split).read_bytes()
    again = bench.make_corpus(500, mini_mirror, tmp_path / "again", seed=3)
    assert (again / "tatoeba-zh-en" / "train.jsonl").read_bytes() == (
        out / "tatoeba-zh-en" / "train.jsonl"
    ).read_bytes()
    made = (out / "tatoeba-zh-en" / "train.jsonl").stat().st_mtime_ns
    assert bench.make_corpus(500, mini_mirror, tmp_path / "m", seed=4) == out  # kept: not made again
    assert (out / "tatoeba-zh-en" / "train.jsonl").stat().st_mtime_ns == made
    assert not list((out / "tatoeba-zh-en").glob("*.partial"))


def test_peak_memory_counts_a_child_processs_anonymous_memory():
    """A process that starts a child holding 200 MB: the tree's anonymous peak includes it."""
    code = (
        "import subprocess, sys, time;"
        "c = subprocess.Popen([sys.executable, '-c', 'b = b\"x\" * (200 << 20); import time; time.sleep(1.5)']);"
        "c.wait()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    with bench.PeakMemory(proc.pid, every=0.01) as peak:
        proc.wait()
    assert peak.anon >= 200 << 20
    assert peak.file > 0 and peak.total >= peak.anon

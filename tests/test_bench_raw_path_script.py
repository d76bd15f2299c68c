"""scripts/bench_raw_path.py: the raw path of runs on the span sets, as one table."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_raw_path", ROOT / "scripts" / "bench_raw_path.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


def report(run, name: str, kept: int, spans: int) -> None:
    (run / "eval").mkdir(parents=True, exist_ok=True)
    score = {"spans": spans, "kept": kept, "accuracy": kept / spans if spans else None}
    (run / "eval" / f"spans-{name}.json").write_text(json.dumps({"bleu": 1.0, "passthrough": score}), encoding="utf-8")


def test_the_table_reads_each_runs_reports_per_set(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    report(one, "valid", 20, 21)
    report(one, "test", 228, 258)
    report(two, "mirror", 0, 0)  # a set without spans: an empty cell, not a division by zero
    rows = script.table([one, two]).splitlines()
    assert rows[0] == "| run | valid | news40 | mirror | mirror-words | test |"
    assert rows[2] == "| one | 95.2% (20 / 21) |  |  |  | 88.4% (228 / 258) |"
    assert rows[3] == "| two |  |  |  |  |  |"


def test_each_run_is_scored_raw_on_every_set_under_names_of_its_own(tmp_path):
    cmd = script.eval_command(tmp_path / "run", tmp_path / "spans")
    assert cmd[1:4] == ["-m", "nmt", "eval"] and "--no-passthrough" in cmd
    names = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--name"]
    assert names == [f"spans-{s}" for s in script.SETS]  # never "test": the run's own report stays
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--src"] == [
        str(tmp_path / "spans" / f"{s}.zh") for s in script.SETS
    ]


def test_main_prints_the_table_and_refuses_missing_span_sets(tmp_path, capsys):
    run = tmp_path / "run"
    report(run, "news40", 1, 2)
    assert script.main([str(run), "--no-eval"]) == 0
    assert "| run |  | 50.0% (1 / 2) |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        script.main([str(run), "--spans", str(tmp_path / "none")])
    assert "no span set" in capsys.readouterr().err

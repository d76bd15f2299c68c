"""scripts/bench_transformers.py: the transformers export against nmt, on a trained tiny run."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

pytest.importorskip("transformers", reason="optional extra nmt[transformers] is not installed")
spec = importlib.util.spec_from_file_location("bench_transformers", ROOT / "scripts" / "bench_transformers.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


def test_texts_are_compared_with_runs_of_spaces_collapsed():
    assert script.same("I love  AI .", "I love AI .") and not script.same("I love AI.", "I love AI .")


@pytest.mark.slow
def test_the_table_counts_the_same_outputs_and_times_both_paths(trained_run, capsys):
    assert script.main(["--run", str(trained_run), "--lines", "6", "--beam", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| 1 |") or line.startswith("| 2 |")]
    counts = [int(row.split("|")[2].split("/")[0]) for row in rows]
    assert len(rows) == 2 and all(0 <= n <= 6 for n in counts) and all("/6 (" in row for row in rows)
    assert any(line.startswith("| transformers") for line in out)
    assert any(line.startswith("| `nmt translate --engine ctranslate2`") for line in out)

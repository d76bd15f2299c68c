"""scripts/length_ratio.py: output/reference words per bucket of reference length."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("length_ratio", ROOT / "scripts" / "length_ratio.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


def test_buckets_by_reference_words_and_sums_words_per_bucket():
    assert [script.bucket(n) for n in (1, 3, 5, 6, 14, 15, 40)] == [0, 1, 1, 2, 4, 5, 5]
    refs = ["a b", "a b c d", "a b c d e", "a b c d e f g h i j k l m n o p"]
    hyps = ["a b c", "a b", "a b c d e f", "a b c d"]
    assert script.ratios(hyps, refs) == [("< 3", 1, 1.5), ("3-5", 2, 8 / 9), (">= 15", 1, 0.25)]


def test_the_table_prints_a_row_per_bucket(tmp_path, capsys):
    (tmp_path / "h").write_text("a\na b c d e f g h i j\n", encoding="utf-8")
    (tmp_path / "r").write_text("a b\na b c d e f g h i j k l m n o p q r s t\n", encoding="utf-8")
    script.main([str(tmp_path / "h"), str(tmp_path / "r")])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2:] == ["| < 3 | 1 | 0.50 |", "| >= 15 | 1 | 0.50 |"]


def test_unequal_files_are_refused():
    with pytest.raises(SystemExit, match="2 hypotheses against 1 references"):
        script.ratios(["a", "b"], ["a"])

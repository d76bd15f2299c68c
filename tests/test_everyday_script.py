"""scripts/everyday.py: the everyday sentences of data/ translated by a run, beside their references."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("everyday", ROOT / "scripts" / "everyday.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


def test_the_checked_in_sentences_align_and_are_not_blank():
    zh = (ROOT / "data/everyday.zh").read_text(encoding="utf-8").splitlines()
    en = (ROOT / "data/everyday.en").read_text(encoding="utf-8").splitlines()
    assert len(zh) == len(en) >= 30 and all(z.strip() and e.strip() for z, e in zip(zh, en, strict=True))
    assert "我明天要去北京。" in zh and "你好，世界。" in zh  # the README's demo sentences


@pytest.mark.slow
def test_every_sentence_is_printed_with_the_run_s_output_and_its_reference(trained_run, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # rich wraps the table to the terminal: one row a line here
    assert script.main(["--run", str(trained_run), "--engine", "native", "--beam", "1"]) == 0
    out = capsys.readouterr().out
    hyps = (trained_run / "eval/everyday.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 30 and "I'm going to Beijing tomorrow." in out and "我明天要去北京。" in out
    report = json.loads((trained_run / "eval/everyday.json").read_text(encoding="utf-8"))
    assert report["bleu"] >= 0 and report["bleu_signature"].startswith("nrefs:1")


def test_a_run_without_a_config_is_one_line(tmp_path, capsys):
    assert script.main(["--run", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("\n") == 1

"""nmt.export.provenance: what a run was trained on, as every export format carries it."""

from __future__ import annotations

import json

from nmt.config import Config
from nmt.export.provenance import data_lines, training_data


def test_a_research_only_run_says_so_and_an_old_run_says_what_is_unknown(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    prov = {"corpora": [{"corpus": "youdao_coca", "source": "x", "licence": "none", "research_only": True}]}
    prov["research_only"] = True
    (corpus / "stats.json").write_text(json.dumps({"provenance": prov}), encoding="utf-8")
    (corpus / "DATA.md").write_text("# Training data\n\n**Research and benchmarking only.**\n", encoding="utf-8")
    assert training_data(tmp_path, Config()) == prov
    assert data_lines(tmp_path, Config()) == ["", "**Research and benchmarking only.**"]

    old = tmp_path / "old"
    assert training_data(old, Config())["corpora"][0]["licence"] == "not recorded"
    assert data_lines(old, Config())[0].startswith("Corpus `tatoeba`; no corpus/DATA.md")

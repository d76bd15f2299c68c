import json

import pytest
from learning import LOG, assert_learned


def test_a_figure_past_its_bound_passes_and_is_recorded(tmp_path, monkeypatch):
    log = tmp_path / "learned.jsonl"
    monkeypatch.setenv(LOG, str(log))
    monkeypatch.setenv("NMT_KIND", "aten-avx2")
    assert_learned("copy/bleu", 99.5, 95)
    assert_learned("copy/loss", 0.1, 0.5, above=False)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["name"], r["value"], r["bound"], r["kind"]) for r in rows] == [
        ("copy/bleu", 99.5, 95, "aten-avx2"),
        ("copy/loss", 0.1, 0.5, "aten-avx2"),
    ]


@pytest.mark.parametrize(("value", "above"), [(94.0, True), (0.6, False)])
def test_a_figure_short_of_its_bound_fails_after_being_recorded(tmp_path, monkeypatch, value, above):
    log = tmp_path / "learned.jsonl"
    monkeypatch.setenv(LOG, str(log))
    with pytest.raises(AssertionError, match="its bound"):
        assert_learned("x", value, 95 if above else 0.5, above=above)
    assert json.loads(log.read_text())["value"] == value

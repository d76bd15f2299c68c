"""Monolingual text (`nmt.data.mono`): each cleaning rule, the overlap guard, counts that add up."""

from __future__ import annotations

import pytest

from nmt.config import DataConfig
from nmt.data.mono import HubText, mono_source, read_mono
from nmt.errors import NmtError


def test_cleaning_drops_and_counts_each_rule_and_keeps_the_rest_verbatim(tmp_path):
    data = DataConfig(direction="en-zh", max_chars=40)
    path = tmp_path / "train.en"
    raw = [
        b"  The cat sleeps.  ",
        b"",
        b"bad \xff byte",
        b"a bell\x07 rings",
        ("x" * 41).encode(),
        b"The cat sleeps.",  # a duplicate once stripped
        "Ｔｈｅ cat sleeps.".encode(),  # and once normalised (NFKC)
        b"We meet at nine.",  # a test reference
        "\ufeffHello there.".encode(),
    ]
    path.write_bytes(b"\n".join(raw) + b"\n")
    text = read_mono(path, data, held_out=["We meet at nine."])
    assert text.lines == ["The cat sleeps.", "Hello there."]
    report = text.report()
    assert report["read"] == 9 and report["kept"] == 2
    assert report["dropped"] == {"bad_line": 1, "empty": 1, "control": 1, "too_long": 1, "duplicate": 2, "overlap": 1}
    assert report["read"] == report["kept"] + sum(report["dropped"].values())


def test_a_directory_means_its_train_file_and_a_missing_one_is_one_line(tmp_path):
    (tmp_path / "train.en").write_text("Hi.\n", encoding="utf-8")
    assert mono_source(tmp_path, "en") == tmp_path / "train.en"
    with pytest.raises(NmtError, match=r"train.zh\b.*not found") as err:
        mono_source(tmp_path, "zh")
    assert "\n" not in str(err.value)


# Rows as `datasets.load_dataset("Salesforce/wikitext", "wikitext-103-raw-v1", split="train",
# streaming=True)` yields them: {"text": str}, blank rows between paragraphs, headings " = T = ".
WIKITEXT_ROWS = [
    {"text": ""},
    {"text": " = Valkyria Chronicles III = \n"},
    {"text": ""},
    {"text": " The game began development in 2010 . \n"},
    {"text": " We meet at nine. \n"},
    {"text": " The game began development in 2010 . \n"},
    {"text": None},
]


@pytest.fixture
def fake_hub(monkeypatch):
    """`datasets.load_dataset` answering with WIKITEXT_ROWS; records what it was asked."""
    import datasets

    asked: list = []

    def load_dataset(name, config=None, *, split, streaming):
        asked.append((name, config, split, streaming))
        return iter(WIKITEXT_ROWS)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no reachability probe
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return asked


def test_a_hub_dataset_of_text_rows_is_cleaned_like_a_file(fake_hub):
    source = mono_source("hub:Salesforce/wikitext?config=wikitext-103-raw-v1", "en")
    assert source == HubText("Salesforce/wikitext", "wikitext-103-raw-v1")
    text = read_mono(source, DataConfig(direction="en-zh"), held_out=["We meet at nine."])
    assert fake_hub == [("Salesforce/wikitext", "wikitext-103-raw-v1", "train", True)]
    assert text.lines == ["= Valkyria Chronicles III =", "The game began development in 2010 ."]
    assert text.report()["dropped"] == {
        "bad_line": 1,
        "empty": 2,
        "control": 0,
        "too_long": 0,
        "duplicate": 1,
        "overlap": 1,
    }


def test_hub_spec_keys_limit_and_nested_columns(fake_hub, monkeypatch):
    limited = read_mono(mono_source("hub:Salesforce/wikitext?limit=2", "en"), DataConfig(direction="en-zh"))
    assert limited.read == 2 and limited.lines == ["= Valkyria Chronicles III ="]
    spec = "hub:some/pairs?split=validation&column=translation.en"
    assert str(mono_source(spec, "en")) == "hub:some/pairs?split=validation&column=translation.en"
    import datasets

    rows = [{"translation": {"en": "Hello.", "zh": "你好。"}}, {"translation": {"zh": "只有中文"}}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: iter(rows))
    nested = read_mono(mono_source(spec, "en"), DataConfig(direction="en-zh"))
    assert nested.lines == ["Hello."] and nested.dropped["bad_line"] == 1
    for bad, message in [
        ("hub:", "name a dataset"),
        ("hub:a/b?colum=x", "unknown key 'colum'"),
        ("hub:a/b?limit=ten", "limit='ten' is not a whole number"),
    ]:
        with pytest.raises(NmtError, match=message):
            mono_source(bad, "en")


def test_an_unreachable_hub_dataset_is_one_line(monkeypatch):
    import datasets

    def fail(*a, **k):
        raise ConnectionError("Couldn't reach 'Salesforce/wikitext' on the Hub\n(more lines)")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(NmtError, match=r"hub dataset Salesforce/wikitext \(default, train\): could not load") as err:
        read_mono(mono_source("hub:Salesforce/wikitext", "en"), DataConfig(direction="en-zh"))
    assert "\n" not in str(err.value)

"""Monolingual text (`nmt.data.mono`): each cleaning rule, the overlap guard, counts that add up."""

from __future__ import annotations

import pytest

from nmt.config import DataConfig
from nmt.data.mono import mono_file, read_mono
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
    assert mono_file(tmp_path, "en") == tmp_path / "train.en"
    with pytest.raises(NmtError, match=r"train.zh\b.*not found") as err:
        mono_file(tmp_path, "zh")
    assert "\n" not in str(err.value)

"""nmt.data.hub_cache: a hub split downloaded once into the hub cache, then cleaned from its
Parquet row groups on all workers; through a stand-in hub in the real schemas (tests/fake_hub.py)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from conftest import warns
from fake_hub import FakeHub, translation_rows
from synthetic import pairs

from nmt.config import config_from_dict
from nmt.data import units
from nmt.data.corpus import prepare_corpus
from nmt.data.hub_cache import row_group_units
from nmt.errors import NmtError

TRAIN = pairs(150, seed=5)
VALID = pairs(12, seed=6)
BROKEN_AT = 40  # a record without its English side, as row 41 of the train split


def wmt_tables() -> dict:
    train = translation_rows(TRAIN)
    train.insert(BROKEN_AT, {"translation": {"zh": "缺少英文。"}})
    train.insert(90, train[10])  # a repeat, dropped by dedup across row groups
    return {("wmt/wmt19", "zh-en", "train"): train, ("wmt/wmt19", "zh-en", "validation"): translation_rows(VALID)}


def prepare(tmp_path: Path, name: str, workers: int = 1, **data) -> dict:
    config = config_from_dict({"name": "t", "data": {"corpus": "wmt19", "workers": workers, **data}})
    with warns():  # the broken row, and wmt19 having no test split
        return prepare_corpus(config, tmp_path / name)


def corpus_bytes(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "corpus").iterdir())}


def test_a_second_preparation_downloads_nothing(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch, tmp_path / "hf", wmt_tables())
    first = prepare(tmp_path, "a")
    assert sorted(hub.downloads) == [
        f"zh-en/{s}-{i:05d}-of-00002.parquet" for s in ("train", "validation") for i in (0, 1)
    ]
    assert first["train"]["dropped"]["bad_line"] == 1 and first["train"]["dropped"]["duplicate"] == 1
    assert first["train"]["bad_lines"] == {"record missing 'en'": {"count": 1, "first_line": BROKEN_AT + 1}}
    hub.downloads.clear(), hub.resolved.clear()
    monkeypatch.setattr("nmt.data.hub.check_reachable", lambda d: pytest.fail("probed with every file cached"))
    second = prepare(tmp_path, "b")  # another run directory: nothing downloaded, nothing resolved
    assert hub.downloads == [] and hub.resolved == [] and second == first
    assert corpus_bytes(tmp_path / "a") == corpus_bytes(tmp_path / "b")
    index = next((tmp_path / "hf" / "datasets--wmt--wmt19" / "nmt").glob("*train.json"))
    assert json.loads(index.read_text())["files"] == [f"zh-en/train-{i:05d}-of-00002.parquet" for i in (0, 1)]


def test_a_file_pruned_from_the_cache_is_fetched_again_alone(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch, tmp_path / "hf", wmt_tables())
    prepare(tmp_path, "a")
    snapshot = tmp_path / "hf" / "datasets--wmt--wmt19" / "snapshots" / hub.commit
    (snapshot / "zh-en" / "train-00001-of-00002.parquet").unlink()
    hub.downloads.clear(), hub.resolved.clear()
    prepare(tmp_path, "b")
    assert hub.downloads == ["zh-en/train-00001-of-00002.parquet"] and hub.resolved == []
    assert corpus_bytes(tmp_path / "a") == corpus_bytes(tmp_path / "b")


def test_row_group_units_and_one_or_two_workers_give_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(units, "UNIT_LINES", 10)  # row groups of 7 rows: units of two groups, cut per file
    hub = FakeHub(monkeypatch, tmp_path / "hf", wmt_tables())
    one = prepare(tmp_path, "one", workers=1)
    snapshot = tmp_path / "hf" / "datasets--wmt--wmt19" / "snapshots" / hub.commit / "zh-en"
    files = tuple(sorted(snapshot.glob("train-*.parquet")))
    plan = row_group_units(files, 10)
    assert [(p.name[:11], first, n) for p, first, n in plan][:2] == [("train-00000", 0, 2), ("train-00000", 2, 2)]
    assert len(plan) > 4 and {p for p, _, _ in plan} == set(files)  # several units in each file
    two = prepare(tmp_path, "two", workers=2)
    assert one == two and corpus_bytes(tmp_path / "one") == corpus_bytes(tmp_path / "two")
    assert one["train"]["bad_lines"]["record missing 'en'"]["first_line"] == BROKEN_AT + 1  # a row of the split


def stream_instead(monkeypatch, tables: dict, cache: Path) -> list:
    """`datasets` resolving the split to JSON files (not Parquet: streamed, the old path) and
    streaming the same rows, with an empty hub cache; returns the streamed (dataset, split) calls."""
    streamed: list = []
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))

    def builder(path, name=None, *, data_files=None, revision=None, **kw):
        prefix = data_files and next(iter(data_files.values())).split("/")[0]
        found = {s for (repo, config, s) in tables if repo == path and config in (name, prefix)}
        urls = {s: [f"hf://datasets/{path}@{'f' * 40}/{s}.jsonl"] for s in found}
        return types.SimpleNamespace(config=types.SimpleNamespace(data_files=urls))

    def load_dataset(path, name=None, *, split=None, streaming=False, data_files=None, revision=None, **kw):
        streamed.append((path, split))
        prefix = data_files[split].split("/")[0] if data_files else name
        return iter([dict(r) for r in tables[(path, prefix, split)]])

    fake = types.SimpleNamespace(load_dataset_builder=builder, load_dataset=load_dataset)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    return streamed


def test_the_row_group_path_gives_what_streaming_gave(tmp_path, monkeypatch):
    """The same rows streamed (a split that is not Parquet) and read from cached row groups: the same corpus."""
    monkeypatch.setattr(units, "UNIT_LINES", 10)
    tables = wmt_tables()
    FakeHub(monkeypatch, tmp_path / "hf", tables)
    cached = prepare(tmp_path, "cached", workers=2)
    streamed = stream_instead(monkeypatch, tables, tmp_path / "hf2")
    old = prepare(tmp_path, "streamed", workers=2)
    assert {split for _, split in streamed} == {"train", "validation"}
    assert old == cached and corpus_bytes(tmp_path / "streamed") == corpus_bytes(tmp_path / "cached")


def tatoeba_tables() -> dict:
    """Flat rows of the Tatoeba Parquet conversion: every/rest sampling of validation, labels kept."""
    from synthetic import script_code

    rows = [
        {"sourceLang": "eng", "targetlang": script_code(z), "sourceString": e, "targetString": z}
        for z, e in pairs(200, seed=8)
    ]
    rows[3]["targetlang"] = "yue_Hans"  # another language of the same file: not read
    test = [dict(r) for r in rows[:20]]
    return {
        ("Helsinki-NLP/tatoeba_mt", "eng-zho", "validation"): rows[20:],
        ("Helsinki-NLP/tatoeba_mt", "eng-zho", "test"): test,
    }


def test_the_tatoeba_conversion_splits_and_labels_alike_on_both_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(units, "UNIT_LINES", 10)
    tables = tatoeba_tables()
    hub = FakeHub(monkeypatch, tmp_path / "hf", tables, files=3)
    config = config_from_dict({"name": "t", "data": {"workers": 2}})
    cached = prepare_corpus(config, tmp_path / "cached")
    assert {r["revision"] for r in hub.resolved} == {"refs/convert/parquet"}
    # train and valid share the hub's validation split: resolved and downloaded once
    assert [r["data_files"] for r in hub.resolved] == [{s: f"eng-zho/{s}/*.parquet"} for s in ("validation", "test")]
    assert sorted(hub.downloads) == [f"eng-zho/{s}/{i:04d}.parquet" for s in ("test", "validation") for i in range(3)]
    stream_instead(monkeypatch, tables, tmp_path / "hf2")
    streamed = prepare_corpus(config, tmp_path / "streamed")
    assert streamed == cached and corpus_bytes(tmp_path / "streamed") == corpus_bytes(tmp_path / "cached")
    valid, train = (tmp_path / "cached/corpus/valid.en").read_text(), (tmp_path / "cached/corpus/train.en").read_text()
    assert 0 < len(valid.splitlines()) < 40 and not set(valid.splitlines()) & set(train.splitlines())
    assert (tmp_path / "cached/corpus/test.codes").read_text().splitlines()[:3] == [
        r["targetlang"] for r in tables[("Helsinki-NLP/tatoeba_mt", "eng-zho", "test")] if r["targetlang"] != "yue_Hans"
    ][:3]


def test_a_download_that_fails_is_one_line_naming_the_dataset(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch, tmp_path / "hf", wmt_tables())

    def refuse(*args, **kwargs):
        raise OSError("Connection reset by peer\nand a second line")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    config = config_from_dict({"name": "t", "data": {"corpus": "wmt19", "workers": 1}})
    failed = r"hub dataset wmt/wmt19 \(zh-en, (train|validation)\): could not download"  # the first split fetched
    with pytest.raises(NmtError, match=failed) as err:
        prepare_corpus(config, tmp_path / "run")
    assert "\n" not in str(err.value) and "--mirror DIR" in str(err.value) and hub.downloads == []
    assert not list((tmp_path / "hf").rglob("*.json"))  # nothing remembered: the next run resolves again


def test_a_stopped_preparation_continues_at_the_first_unfinished_row_group_unit(tmp_path, monkeypatch):
    from nmt.data import clean

    monkeypatch.setattr(units, "UNIT_LINES", 10)
    FakeHub(monkeypatch, tmp_path / "hf", wmt_tables())
    whole = prepare(tmp_path, "whole")
    original, calls = clean.clean_unit, []

    def stop_at_the_fourth(unit):
        if unit.index == 3:
            raise KeyboardInterrupt
        return original(unit)

    monkeypatch.setattr(clean, "clean_unit", stop_at_the_fourth)
    with pytest.raises(KeyboardInterrupt), warns("no test split"):
        prepare_corpus(config_from_dict({"data": {"corpus": "wmt19", "workers": 1}}), tmp_path / "run")
    work = tmp_path / "run/corpus.work/train"

    def counting(unit):
        calls.append(clean.unit_path(work, unit.index, ".json").is_file())
        return original(unit)

    monkeypatch.setattr(clean, "clean_unit", counting)
    assert prepare(tmp_path, "run") == whole and corpus_bytes(tmp_path / "run") == corpus_bytes(tmp_path / "whole")
    assert calls[:4] == [True, True, True, False] and len(calls) > 4

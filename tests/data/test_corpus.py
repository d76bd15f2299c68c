"""nmt.data.corpus: mirror readers, train cleaning rules, raw valid/test, bad input, atomic output, stamps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import warns

from nmt.config import Config, config_from_dict
from nmt.data.clean import length_ratio
from nmt.data.corpus import prepare_corpus
from nmt.data.normalize import normalize_source, normalize_target
from nmt.data.recipes import RECIPES
from nmt.errors import NmtError

VALID = [("我们去公园吧。", "Let's go to the park."), ("他很高。", "He is tall.")]
TEST = [("我喜欢猫。", "I like cats."), ("今天下雨。", "It rains today.")]
TRAIN = [
    ("我爱你。", "I love you."),
    ("你好吗", "How are you?"),
    ("这是一本书。", "This is a book."),
    ("她在看电视。", "She is watching TV."),
]


def config(**data) -> Config:
    return config_from_dict({"name": "t", "data": {"corpus": "tatoeba", **data}})


def write_jsonl(path: Path, pairs, raw_lines: dict[int, bytes] | None = None) -> Path:
    """pairs as HF translation records; raw_lines[i] replaces line i (0-based) with raw bytes."""
    lines = [json.dumps({"translation": {"zh": z, "en": e}}, ensure_ascii=False).encode() for z, e in pairs]
    for i, raw in (raw_lines or {}).items():
        lines.insert(i, raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def mirror(root: Path, train=TRAIN, valid=VALID, test=TEST, subdir: str = "tatoeba-zh-en") -> Path:
    folder = root / subdir if subdir else root
    write_jsonl(folder / "train.jsonl", train)
    write_jsonl(folder / "validation.jsonl", valid)
    write_jsonl(folder / "test.jsonl", test)
    return root


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def run(tmp_path: Path, train=TRAIN, valid=VALID, test=TEST, **data) -> tuple[dict, Path]:
    root = mirror(tmp_path / "m", train, valid, test)
    stats = prepare_corpus(config(**data), tmp_path / "run", mirror=str(root))
    return stats, tmp_path / "run" / "corpus"


def check_invariant(stats: dict) -> None:
    for split in ("train", "valid", "test"):
        s = stats[split]
        assert s["read"] == s["kept"] + sum(s["dropped"].values()), split


# --------------------------------------------------------------------------- cleaning rules


def test_clean_corpus_is_written_with_stats(tmp_path):
    stats, out = run(tmp_path)
    assert lines(out / "train.zh") == [z for z, _ in TRAIN]
    assert lines(out / "train.en") == [e for _, e in TRAIN]
    assert stats["train"]["kept"] == 4 and stats["valid"]["kept"] == 2 and stats["test"]["kept"] == 2
    assert json.loads((out / "stats.json").read_text()) == stats
    check_invariant(stats)


def test_empty_pairs_are_dropped_and_counted(tmp_path):
    stats, out = run(tmp_path, TRAIN + [("", "Hello."), ("你好", "   "), ("\u3000", "Hi.")])
    assert stats["train"]["dropped"]["empty"] == 3
    assert "Hello." not in lines(out / "train.en") and "你好" not in lines(out / "train.zh")
    check_invariant(stats)


def test_too_long_pairs_are_dropped(tmp_path):
    long_zh = "我" * 31
    stats, out = run(tmp_path, TRAIN + [(long_zh, "I " * 10)], max_chars=30)
    assert stats["train"]["dropped"]["too_long"] == 1
    assert long_zh not in lines(out / "train.zh")


def test_length_ratio_drops_unbalanced_pairs(tmp_path):
    data = config().data
    assert length_ratio("这是一本书。", "This is a book.", data) < 2.0
    bad = ("好。", "This is a much longer English sentence than the two characters on the other side.")
    stats, out = run(tmp_path, TRAIN + [bad], max_ratio=9.0)
    assert stats["train"]["dropped"]["ratio"] == 1
    assert bad[1] not in lines(out / "train.en")
    stats, out = run(tmp_path / "loose", TRAIN + [bad], max_ratio=100.0)
    assert stats["train"]["dropped"]["ratio"] == 0 and bad[1] in lines(out / "train.en")


def test_duplicates_are_dropped_after_normalisation(tmp_path):
    dup = ("我愛你。", "I  love you.")  # same as TRAIN[0] after t2s and whitespace collapse
    stats, out = run(tmp_path, TRAIN + [dup, TRAIN[1]])
    assert stats["train"]["dropped"]["duplicate"] == 2
    assert lines(out / "train.zh").count("你好吗") == 1
    stats, _ = run(tmp_path / "nodedup", TRAIN + [TRAIN[1]], dedup=False)
    assert stats["train"]["dropped"]["duplicate"] == 0 and stats["train"]["kept"] == 5


def test_overlap_with_valid_or_test_is_dropped(tmp_path):
    leaks = [("他很高。", "Some other English."), ("别的句子。", "I like cats."), ("我們去公園吧。", "Go to park.")]
    stats, out = run(tmp_path, TRAIN + leaks)
    assert stats["train"]["dropped"]["overlap"] == 3  # zh of valid; en of test; zh of valid after t2s
    assert lines(out / "train.zh") == [z for z, _ in TRAIN]
    stats, _ = run(tmp_path / "off", TRAIN + leaks, filter_overlap=False)
    assert stats["train"]["dropped"]["overlap"] == 0 and stats["train"]["kept"] == 7


def test_t2s_converts_traditional_train_source(tmp_path):
    _, out = run(tmp_path, [("我們說國語。", "We speak Mandarin.")])
    assert lines(out / "train.zh") == ["我们说国语。"]
    _, out = run(tmp_path / "off", [("我們說國語。", "We speak Mandarin.")], t2s=False)
    assert lines(out / "train.zh") == ["我們說國語。"]


def test_nfkc_folds_full_width_forms(tmp_path):
    pair = ("ＡＢＣ１２３，好！", "Ｆｕｌｌ width")
    _, out = run(tmp_path, [pair])
    assert lines(out / "train.zh") == ["ABC123,好!"] and lines(out / "train.en") == ["Full width"]
    _, out = run(tmp_path / "off", [pair], nfkc=False)
    assert lines(out / "train.zh") == [pair[0]]


def test_internal_newlines_and_tabs_become_spaces(tmp_path):
    _, out = run(tmp_path, [("你好\n世界", "Hello\tthere\r\nworld \u2028 again")])
    assert lines(out / "train.zh") == ["你好 世界"] and lines(out / "train.en") == ["Hello there world again"]


def test_valid_and_test_are_raw_references(tmp_path):
    valid = [("  我們說國語。 ", "ＦＵＬＬ\nwidth "), ("", ""), ("他很高。", "He is tall.")]
    test = [("頭髮\t很長", ""), ("我喜欢猫。", "I like cats.")]
    stats, out = run(tmp_path, valid=valid, test=test)
    assert lines(out / "valid.zh") == ["我們說國語。", "他很高。"]  # no t2s, no NFKC
    assert lines(out / "valid.en") == ["ＦＵＬＬ width", "He is tall."]
    assert stats["valid"]["dropped"]["empty"] == 1  # both sides empty: dropped from valid only
    assert lines(out / "test.zh") == ["頭髮 很長", "我喜欢猫。"] and lines(out / "test.en") == ["", "I like cats."]
    assert stats["test"]["kept"] == 2
    check_invariant(stats)


def test_normalize_source_matches_training(tmp_path):
    data = config().data
    assert normalize_source(" 我們說國語 ！", data) == "我们说国语 !"
    assert normalize_target("Ｈｉ  there", data) == "Hi there"


def test_max_train_pairs_subsamples_with_seed_in_order(tmp_path):
    train = [(f"句子{i}。", f"Sentence {i}.") for i in range(60)]
    stats, out = run(tmp_path, train, max_train_pairs=10, seed=3)
    got = lines(out / "train.en")
    assert len(got) == 10 and stats["train"]["dropped"]["subsampled"] == 50
    assert got == sorted(got, key=lambda s: int(s.split()[1].rstrip(".")))  # original order kept
    _, again = run(tmp_path / "same", train, max_train_pairs=10, seed=3)
    _, other = run(tmp_path / "other", train, max_train_pairs=10, seed=4)
    assert lines(again / "train.en") == got and lines(other / "train.en") != got
    check_invariant(stats)


# --------------------------------------------------------------------------- mirror readers


def test_tsv_mirror(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    for name, pairs in (("train", TRAIN), ("validation", VALID), ("test", TEST)):
        (root / f"{name}.tsv").write_text("".join(f"{z}\t{e}\tattribution\n" for z, e in pairs), encoding="utf-8")
    stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert lines(tmp_path / "run/corpus/train.en") == [e for _, e in TRAIN]
    assert stats["valid"]["source"].endswith("validation.tsv")


def test_plain_parallel_mirror(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    for name, pairs in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        (root / f"{name}.zh").write_text("".join(z + "\n" for z, _ in pairs), encoding="utf-8")
        (root / f"{name}.en").write_text("".join(e + "\n" for _, e in pairs), encoding="utf-8")
    prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert lines(tmp_path / "run/corpus/train.zh") == [z for z, _ in TRAIN]
    assert lines(tmp_path / "run/corpus/test.en") == [e for _, e in TEST]


def test_recipe_subdir_and_direct_files(tmp_path):
    sub = mirror(tmp_path / "sub", subdir="tatoeba-zh-en")
    direct = mirror(tmp_path / "direct", train=TRAIN[:2], subdir="")
    assert prepare_corpus(config(), tmp_path / "r1", mirror=str(sub))["train"]["kept"] == 4
    assert prepare_corpus(config(), tmp_path / "r2", mirror=str(direct))["train"]["kept"] == 2


def test_mirror_from_env_and_config(tmp_path, monkeypatch):
    root = mirror(tmp_path / "m")
    monkeypatch.setenv("NMT_MIRROR", str(root))
    assert prepare_corpus(config(), tmp_path / "r1")["train"]["kept"] == 4
    monkeypatch.setenv("NMT_MIRROR", str(tmp_path / "nowhere"))
    assert prepare_corpus(config(mirror=str(root)), tmp_path / "r2")["train"]["kept"] == 4  # config wins
    with pytest.raises(NmtError, match="nowhere.*NMT_MIRROR"):
        prepare_corpus(config(), tmp_path / "r3")


def test_hub_path_streams_with_datasets_when_the_files_are_not_parquet(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, cfg, split, streaming, **kw):
        calls.append((name, cfg, split, streaming))
        pairs = {"train": TRAIN, "validation": VALID, "test": TEST}[split]
        return iter([{"translation": {"zh": z, "en": e}} for z, e in pairs] + [{"translation": {"zh": "x"}}])

    def load_dataset_builder(name, cfg, **kw):  # the splits' data files: JSON, not Parquet (hub_cache)
        files = {s: [f"hf://datasets/{name}@{'a' * 40}/{cfg}/{s}.jsonl"] for s in ("train", "validation", "test")}
        return types.SimpleNamespace(config=types.SimpleNamespace(data_files=files))

    monkeypatch.delenv("NMT_MIRROR", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    fake = types.SimpleNamespace(load_dataset=load_dataset, load_dataset_builder=load_dataset_builder)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr("nmt.data.hub.check_reachable", lambda dataset: None)
    with warns("record missing 'en'"):
        stats = prepare_corpus(config(corpus="wmt17"), tmp_path / "run")
    assert {c[2] for c in calls} == {"train", "validation", "test"} and all(c[3] for c in calls)
    assert calls[0][:2] == (RECIPES["wmt17"].hub, "zh-en") and stats["train"]["kept"] == 4


def test_test_codes_are_copied_and_stay_aligned(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    write_jsonl(root / "test.jsonl", TEST, raw_lines={1: b"{broken"})
    (root / "test.codes.txt").write_text("cmn_Hans\ncmn_Hant\ncmn\n")
    with warns(r"test.jsonl:2: invalid JSON"):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    out = tmp_path / "run/corpus"
    assert lines(out / "test.codes") == ["cmn_Hans", "cmn"] and len(lines(out / "test.zh")) == 2


# --------------------------------------------------------------------------- bad input


def test_malformed_json_line_is_skipped_with_warning(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    write_jsonl(root / "train.jsonl", TRAIN, raw_lines={1: b'{"translation": {"zh": "x"', 3: b"not json"})
    with warns(r"train\.jsonl:2: invalid JSON \(skipped 2 bad lines\)"):
        stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert stats["train"]["dropped"]["bad_line"] == 2 and stats["train"]["kept"] == 4
    check_invariant(stats)


def test_record_missing_a_language_is_skipped(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    write_jsonl(root / "train.jsonl", TRAIN, raw_lines={0: json.dumps({"translation": {"zh": "只有中文"}}).encode()})
    with warns(r"train\.jsonl:1: record missing 'en' \(skipped 1 bad line\)"):
        stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert stats["train"]["dropped"]["bad_line"] == 1


def test_invalid_utf8_is_skipped(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    write_jsonl(root / "train.jsonl", TRAIN, raw_lines={2: b'{"translation": {"zh": "\xff\xfe", "en": "x"}}'})
    with warns(r"train\.jsonl:3: invalid UTF-8"):
        stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert stats["train"]["dropped"]["bad_line"] == 1 and stats["train"]["kept"] == 4


def test_split_with_nothing_usable_names_the_file(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    (root / "train.jsonl").write_bytes(b"nope\n{}\n")
    with warns(), pytest.raises(NmtError, match=r"train\.jsonl: no usable train pairs"):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))


def test_plain_files_with_different_line_counts(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    (root / "train.jsonl").unlink()
    (root / "train.zh").write_text("一\n二\n三\n", encoding="utf-8")
    (root / "train.en").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"train\.zh has 3 lines but .*train\.en has 2"):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))


def test_empty_corpus_after_cleaning(tmp_path):
    train = [VALID[0], ("", "Nothing."), ("好。", "A very long English sentence facing two characters only.")]
    with pytest.raises(
        NmtError, match=r"train\.jsonl: no train pairs left after cleaning .*empty=1, ratio=1, overlap=1"
    ):
        run(tmp_path, train)


def test_missing_mirror_dir(tmp_path):
    with pytest.raises(NmtError, match=r"absent: mirror directory not found \(from --mirror\)"):
        prepare_corpus(config(), tmp_path / "run", mirror=str(tmp_path / "absent"))


def test_unknown_corpus_suggests(tmp_path):
    with pytest.raises(
        NmtError, match=r"data\.corpus: unknown corpus 'tatoba' \(did you mean 'tatoeba'\?\); known: .*wmt19"
    ):
        prepare_corpus(config(corpus="tatoba"), tmp_path / "run", mirror=str(tmp_path))


def test_corpus_without_train_split(tmp_path):
    root = tmp_path / "m"
    write_jsonl(root / "wmt-news-zh-en" / "validation.jsonl", VALID)  # like the real mirror: no train file
    write_jsonl(root / "wmt-news-zh-en" / "test.jsonl", TEST)
    with pytest.raises(NmtError, match="'wmt_news' has no train split.*evaluation"):
        prepare_corpus(config(corpus="wmt_news"), tmp_path / "run", mirror=str(root))


# --------------------------------------------------------------------------- atomic output and stamps


def test_failure_leaves_no_partial_files(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    (root / "train.jsonl").write_bytes(b"garbage\n")
    with warns(), pytest.raises(NmtError):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert list((tmp_path / "run/corpus").iterdir()) == []  # valid/test were written to temp files only


def test_failed_rerun_keeps_previous_corpus(tmp_path):
    root = mirror(tmp_path / "m", subdir="")
    prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    out = tmp_path / "run/corpus"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_jsonl(root / "validation.jsonl", [("新的", "new")])
    (root / "train.jsonl").write_bytes(b"garbage\n")
    with warns(), pytest.raises(NmtError):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "run/download.stamp.json").exists()  # so the next call redoes it


def test_second_call_is_skipped_and_changed_input_redone(tmp_path):
    root = mirror(tmp_path / "m")
    stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    stamp, train_zh = tmp_path / "run/download.stamp.json", tmp_path / "run/corpus/train.zh"
    for p in (stamp, train_zh):  # back-dated: a rewrite would show, whatever the clock's resolution
        os.utime(p, ns=(10**9, 10**9))
    mtimes = (stamp.stat().st_mtime_ns, train_zh.stat().st_mtime_ns)
    assert prepare_corpus(config(), tmp_path / "run", mirror=str(root)) == stats
    assert (stamp.stat().st_mtime_ns, train_zh.stat().st_mtime_ns) == mtimes
    write_jsonl(root / "tatoeba-zh-en/train.jsonl", TRAIN[:2])
    assert prepare_corpus(config(), tmp_path / "run", mirror=str(root))["train"]["kept"] == 2
    assert lines(train_zh) == [z for z, _ in TRAIN[:2]] and stamp.stat().st_mtime_ns != mtimes[0]
    assert prepare_corpus(config(max_chars=11), tmp_path / "run", mirror=str(root))["train"]["kept"] == 1


# --------------------------------------------------------------------------- a whole mirror


def test_a_mirror_in_the_hub_schema(any_mirror, tmp_path, request):
    """The generated mirror everywhere, the real one (../shared/data) where it exists."""
    stats = prepare_corpus(config(max_train_pairs=500), tmp_path / "run", mirror=str(any_mirror))
    out, src = tmp_path / "run/corpus", any_mirror / "tatoeba-zh-en"
    raw_valid = [json.loads(line)["translation"] for line in (src / "validation.jsonl").open(encoding="utf-8")]
    assert lines(out / "valid.zh") == [r["zh"] for r in raw_valid]  # untouched (already stripped)
    assert lines(out / "test.codes") == lines(src / "test.codes.txt")
    assert stats["test"]["kept"] == len(lines(out / "test.en")) == len(lines(src / "test.jsonl"))
    assert stats["train"]["kept"] == 500
    if request.node.callspec.params["any_mirror"] == "real":
        assert stats["test"]["kept"] == 8927 and stats["train"]["dropped"]["overlap"] > 0  # t2s exposes leaks
    assert all(os.path.getsize(out / f) > 0 for f in ("train.zh", "train.en"))
    check_invariant(stats)


# --------------------------------------------------------------------------- the default corpus from the hub


# Real rows of Helsinki-NLP/tatoeba_mt, config eng-zho (Tatoeba Challenge v2021-08-07 test, CC-BY 2.0 FR,
# tatoeba.org contributors), in the columns and order of the hub's Parquet conversion.
def tatoeba_row(code: str, en: str, zh: str) -> dict:
    return {"sourceLang": "eng", "targetlang": code, "sourceString": en, "targetString": zh}


HUB_TEST = [
    tatoeba_row("cjy_Hans", "Tom isn't going to give me that.", "汤姆不会同意的"),
    tatoeba_row("cmn_Hans", "2016 was the hottest year on record.", "2016年是有记录以来最热的一年。"),
    tatoeba_row("cmn_Hans", "Are you a teacher?", "你是不是老师？"),
    tatoeba_row("cmn_Hans", "It's too late to apologize.", "现在道歉也迟了。"),
    tatoeba_row("cmn_Hant", "A little learning is a dangerous thing.", "一知半解很危險。"),
    tatoeba_row("cmn_Hant", "I have lived here for ten years.", "我在這裏住了十年。"),
    tatoeba_row("cmn", "Nancy looks like my sister.", "Nancyå¾åæçå¤§å§ã"),
    tatoeba_row("wuu", "40 dollars for seven days.", "七日天四十块美金。"),
    tatoeba_row("yue_Hant", "Abandon ship!", "棄船呀！"),
]


def hub_dev(n: int = 90) -> list[dict]:
    """Dev rows in the same columns (sentences from tests/synthetic.py), one of them sharing a test side."""
    from synthetic import pairs, script_code

    rows = [tatoeba_row(script_code(zh), en, zh) for zh, en in pairs(n, seed=3)]
    rows.insert(5, tatoeba_row("yue_Hans", "Abandon ship!", "弃船呀！"))
    rows.insert(9, tatoeba_row("cmn_Hans", "Are you a teacher?", "您是老师吗？"))  # English of a test row
    return rows


def fake_tatoeba_hub(monkeypatch, calls: list, tables: dict[str, list[dict]], cache: Path) -> None:
    """The hub as it answers for the Parquet conversion of Helsinki-NLP/tatoeba_mt (tests/fake_hub.py:
    `datasets` resolves the files, `huggingface_hub` downloads them into the cache at `cache`)."""
    from fake_hub import FakeHub

    tables = {("Helsinki-NLP/tatoeba_mt", "eng-zho", split): rows for split, rows in tables.items()}
    hub = FakeHub(monkeypatch, cache, tables, files=1)
    hub.resolved = calls  # each resolution: {"path", "name", "data_files", "revision"}


def test_default_corpus_comes_from_the_tatoeba_parquet_conversion(tmp_path, monkeypatch):
    calls: list = []
    fake_tatoeba_hub(monkeypatch, calls, {"test": HUB_TEST, "validation": hub_dev()}, tmp_path / "hf")
    stats = prepare_corpus(config(), tmp_path / "run")
    out = tmp_path / "run" / "corpus"
    assert sorted(next(iter(c["data_files"])) for c in calls) == ["test", "validation"]
    assert all(c["data_files"] == {s: f"eng-zho/{s}/*.parquet"} for c in calls for s in c["data_files"])
    assert {(c["path"], c["name"], c["revision"]) for c in calls} == {
        ("Helsinki-NLP/tatoeba_mt", None, "refs/convert/parquet")
    }
    mandarin = [r for r in HUB_TEST if r["targetlang"] in ("cmn_Hans", "cmn_Hant", "cmn")]  # file order kept
    assert lines(out / "test.zh") == [r["targetString"] for r in mandarin]
    assert lines(out / "test.en") == [r["sourceString"] for r in mandarin]
    assert lines(out / "test.codes") == ["cmn_Hans"] * 3 + ["cmn_Hant"] * 2 + ["cmn"]
    valid, train = lines(out / "valid.en"), lines(out / "train.en")
    dev_mandarin = [r for r in hub_dev() if r["targetlang"].startswith("cmn")]
    assert 0 < len(valid) < len(dev_mandarin) // 4 and not set(valid) & set(train)
    assert "Are you a teacher?" not in train and stats["train"]["dropped"]["overlap"] == 1  # the overlap guard
    assert len(valid) + stats["train"]["read"] == len(dev_mandarin)
    assert "弃船呀！" not in lines(out / "train.zh") + lines(out / "valid.zh")  # Cantonese rows are not Mandarin
    check_invariant(stats)


def test_hub_validation_sample_is_stable_and_about_one_in_eighteen():
    from nmt.data.recipes import TATOEBA_VALID_EVERY, HubSplit

    english = [f"Sentence number {i}." for i in range(3600)]
    valid = HubSplit("validation", every=TATOEBA_VALID_EVERY)
    rest = HubSplit("validation", every=TATOEBA_VALID_EVERY, rest=True)
    picked = [e for e in english if valid.keeps(e)]
    assert all(valid.keeps(e) != rest.keeps(e) for e in english)
    assert 150 < len(picked) < 250 and picked == [e for e in english if valid.keeps(e)]


def test_missing_hub_files_fail_in_one_line_naming_the_dataset(tmp_path, monkeypatch):
    fake_tatoeba_hub(monkeypatch, [], {"test": HUB_TEST}, tmp_path / "hf")  # no validation folder
    with pytest.raises(NmtError) as err:
        prepare_corpus(config(), tmp_path / "run")
    msg = str(err.value)
    assert "\n" not in msg and "Helsinki-NLP/tatoeba_mt (eng-zho, validation)" in msg
    assert "--mirror DIR" in msg and "NMT_MIRROR" in msg and not (tmp_path / "run" / "corpus" / "test.zh").exists()


@pytest.mark.parametrize(
    "env", [{"HF_ENDPOINT": "http://127.0.0.1:9"}, {"HF_HUB_OFFLINE": "1"}], ids=["unreachable", "offline"]
)
def test_download_without_mirror_or_network_fails_fast_in_one_line(tmp_path, env):
    """The real `datasets`: no hub (refused connection, or offline mode with an empty cache) → one line, seconds."""
    pytest.importorskip("datasets", reason="the hub path needs the datasets package")
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NMT_MIRROR"))}
    root = Path(__file__).resolve().parents[2]
    run_env = keep | env | {"HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "nmt", "download", "-c", str(root / "configs/tiny.yaml"), "--run", str(tmp_path / "r")]
    done = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "Helsinki-NLP/tatoeba_mt" in err and "--mirror DIR" in err and "NMT_MIRROR" in err


def test_one_pair_corpus_saved_with_a_bom(tmp_path):
    """A Windows editor's UTF-8 BOM before the first record loses nothing (it used to drop the only pair)."""
    root = mirror(tmp_path / "m", train=TRAIN[:1], subdir="")
    for name in ("train.jsonl", "validation.jsonl", "test.jsonl"):
        (root / name).write_bytes("\ufeff".encode() + (root / name).read_bytes())
    (root / "test.codes.txt").write_bytes("\ufeffcmn_Hans\ncmn_Hant\n".encode())
    stats = prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    out = tmp_path / "run" / "corpus"
    assert stats["train"]["kept"] == 1 and stats["train"]["dropped"]["bad_line"] == 0
    assert lines(out / "train.zh") == [TRAIN[0][0]] and lines(out / "valid.zh")[0] == VALID[0][0]
    assert lines(out / "test.codes") == ["cmn_Hans", "cmn_Hant"]


def test_an_unreachable_hub_is_probed_once_and_never_loaded(tmp_path, monkeypatch):
    """Failing fast, by mechanism: one HEAD request, no `datasets` call, one line."""
    import urllib.error
    import urllib.request

    from nmt.config import load_config
    from nmt.data import hub

    for key in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "NMT_MIRROR"):
        monkeypatch.delenv(key, raising=False)
    probes: list[str] = []

    def refuse(request, timeout):
        probes.append(f"{request.get_method()} {request.full_url} {timeout}")
        raise urllib.error.URLError("Connection refused")

    def never(*args, **kwargs):
        raise AssertionError("the hub was loaded after a failed probe")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=never))
    root = Path(__file__).resolve().parents[2]
    with pytest.raises(NmtError, match="cannot reach https://huggingface.co .*Connection refused") as err:
        prepare_corpus(load_config(root / "configs/tiny.yaml"), tmp_path / "run")
    assert probes == [f"HEAD https://huggingface.co {hub.PROBE_SECONDS}"]
    assert "\n" not in str(err.value) and "--mirror DIR" in str(err.value)


# --------------------------------------------------------------------------- units, workers, resume


def _many_units(monkeypatch) -> None:
    """Units of 8 KiB / 100 lines, so that a small corpus is several units."""
    from nmt.data import units

    monkeypatch.setattr(units, "UNIT_BYTES", 8192)
    monkeypatch.setattr(units, "UNIT_LINES", 100)


def _noisy_train(n: int = 600) -> list[tuple[str, str]]:
    """Generated pairs (some Traditional), with repeats, full-width forms and a few pairs the rules drop."""
    from synthetic import pairs

    train = pairs(n, seed=5, traditional=0.4)
    train += train[::7]  # repeats, far from their first occurrence
    train += [
        ("ＡＩ來了。", "AI is here."),
        ("", "Empty."),
        ("好。", "A much longer English sentence than the two characters on the other side."),
    ]
    return train + [(z.replace("书", "書"), e) for z, e in train[:20]]  # T→S makes these repeats


def _corpus_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("max_train_pairs", [None, 250])
def test_one_and_two_workers_and_two_run_dirs_give_the_same_bytes(tmp_path, monkeypatch, max_train_pairs):
    _many_units(monkeypatch)
    root = mirror(tmp_path / "m", train=_noisy_train())
    outs = []
    for workers, run_dir in ((1, "a"), (2, "b"), (2, "c")):
        cfg = config(workers=workers, max_train_pairs=max_train_pairs)
        stats = prepare_corpus(cfg, tmp_path / run_dir, mirror=str(root))
        outs.append(_corpus_bytes(tmp_path / run_dir / "corpus"))
        assert not (tmp_path / run_dir / "corpus.work").exists()  # removed once the corpus is written
    assert outs[0] == outs[1] == outs[2]
    assert stats["train"]["dropped"]["duplicate"] > 80 and stats["train"]["read"] > 700
    if max_train_pairs:
        assert stats["train"]["kept"] == 250
    check_invariant(stats)


def test_units_do_not_change_what_is_kept_or_its_order(tmp_path, monkeypatch):
    """Without max_train_pairs, many units give what one unit gives: the first occurrence of each
    pair, in input order (the rule of the one-process cleaner)."""
    root = mirror(tmp_path / "m", train=_noisy_train())
    prepare_corpus(config(workers=1), tmp_path / "one", mirror=str(root))
    _many_units(monkeypatch)
    prepare_corpus(config(workers=2), tmp_path / "many", mirror=str(root))
    assert _corpus_bytes(tmp_path / "one/corpus") == _corpus_bytes(tmp_path / "many/corpus")
    expected, seen, data = [], set(), config().data
    for z, e in _noisy_train():
        pair = (normalize_source(z, data), normalize_target(e, data))
        if pair not in seen and all(pair) and length_ratio(*pair, data) <= 9:
            expected.append(pair)
        seen.add(pair)
    out = tmp_path / "many/corpus"
    assert list(zip(lines(out / "train.zh"), lines(out / "train.en"), strict=True)) == expected


KILLER = """
import os, signal, sys
from pathlib import Path
from nmt.config import config_from_dict
from nmt.data import clean, corpus, units
units.UNIT_BYTES = 8192
original = clean.map_ordered
def dying_map(*args):
    for i, result in enumerate(original(*args)):
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of the stage, 3 units taken
        yield result
clean.map_ordered = dying_map
cfg = config_from_dict({"name": "t", "data": {"corpus": "tatoeba", "workers": int(sys.argv[3])}})
corpus.prepare_corpus(cfg, Path(sys.argv[1]), mirror=sys.argv[2])
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_run_continues_at_the_first_unfinished_unit_with_the_same_bytes(tmp_path, monkeypatch, workers):
    from nmt.data import clean

    _many_units(monkeypatch)
    root = mirror(tmp_path / "m", train=_noisy_train())
    prepare_corpus(config(workers=1), tmp_path / "whole", mirror=str(root))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = [sys.executable, "-c", KILLER, str(tmp_path / "run"), str(root), str(workers)]
    assert subprocess.run(args, env=env).returncode == -9
    work = tmp_path / "run/corpus.work/train"
    finished = len(list(work.glob("u*.json")))  # 3, and with 2 workers those done meanwhile
    assert 3 <= finished < 9 and not (tmp_path / "run/corpus/train.zh").exists()
    original, calls = clean.clean_unit, []

    def counting_unit(unit):
        calls.append(clean.unit_path(work, unit.index, ".json").is_file())
        return original(unit)

    monkeypatch.setattr(clean, "clean_unit", counting_unit)
    prepare_corpus(config(workers=1), tmp_path / "run", mirror=str(root))
    # the units finished before the kill are reused (with 2 workers, the orphaned workers may
    # still finish the units they held: those are reused too, or redone to the same bytes)
    assert calls[:3] == [True, True, True] and sum(calls) >= finished and not all(calls)
    assert _corpus_bytes(tmp_path / "run/corpus") == _corpus_bytes(tmp_path / "whole/corpus")


def test_a_changed_input_does_not_reuse_finished_units(tmp_path, monkeypatch):
    _many_units(monkeypatch)
    root = mirror(tmp_path / "m", train=_noisy_train())
    work = tmp_path / "run/corpus.work/train"
    work.mkdir(parents=True)
    (work / "manifest.json").write_text('{"inputs": "another digest"}')
    (work / "u000000.json").write_text('{"lines": 1, "kept": 0, "dropped": {}, "bad": {}}')  # would be wrong
    prepare_corpus(config(workers=1), tmp_path / "run", mirror=str(root))
    prepare_corpus(config(workers=1), tmp_path / "fresh", mirror=str(root))
    assert _corpus_bytes(tmp_path / "run/corpus") == _corpus_bytes(tmp_path / "fresh/corpus")


def test_the_manifest_holds_each_file_hash_and_line_count(tmp_path):
    import hashlib

    _, out = run(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    for name in ("train.zh", "train.en", "valid.zh", "test.en", "stats.json"):
        data = (out / name).read_bytes()
        assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "lines": data.count(b"\n")}
    assert manifest["kept"]["train"] == len(lines(out / "train.zh"))


# --------------------------------------------------------------------------- bad input at scale


def test_every_bad_line_is_counted_by_reason_with_its_first_line(tmp_path, monkeypatch):
    _many_units(monkeypatch)
    good = [json.dumps({"translation": {"zh": z, "en": e}}, ensure_ascii=False).encode() for z, e in _noisy_train()]
    bad = {
        30: b'{"translation": {"zh": "\xff\xfe", "en": "x"}}',  # invalid UTF-8
        31: b'{"translation": {"zh": "a\x00b", "en": "x"}}',  # a raw NUL byte
        90: b'{"translation": {"zh": "a\\u0000b", "en": "x"}}',  # a NUL written as an escape
        200: b'{"translation": {"zh": "' + "长".encode() * (4 << 20) + b'", "en": "x"}}',  # a 12 MB line
        400: b'{"translation": {"zh": "x"',  # malformed JSON
        401: b'{"translation": {"en": "only English"}}',  # a record without one side
        650: b"   ",  # blank
        651: b"not json",
    }
    rows = list(good)
    for i in sorted(bad):
        rows.insert(i, bad[i])
    root = mirror(tmp_path / "m", subdir="")
    (root / "train.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    with warns(
        r"train\.jsonl:31: invalid UTF-8 \(skipped 8 bad lines\); 2 NUL byte \(first line 32\), .*"
        r"2 invalid JSON \(first line 401\)",
    ):
        stats = prepare_corpus(config(workers=2), tmp_path / "run", mirror=str(root))
    assert (
        stats["train"]["bad_lines"]
        == {
            "NUL byte": {"count": 2, "first_line": 32},
            "blank line": {"count": 1, "first_line": 651},
            "invalid JSON": {"count": 2, "first_line": 401},
            "invalid UTF-8": {"count": 1, "first_line": 31},
            "line longer than 1 MiB": {"count": 1, "first_line": 201},
            "record missing 'zh'": {"count": 1, "first_line": 402},
        }
        | {}
    )
    assert stats["train"]["dropped"]["bad_line"] == 8
    check_invariant(stats)


def _formats(root: Path, train: list[tuple[str, str]], kind: str, compress: str) -> Path:
    """A mirror whose train split is `kind` (jsonl, tsv, plain), compressed with `compress` ("", gz, xz)."""
    import gzip
    import lzma

    pack = {"": bytes, "gz": gzip.compress, "xz": lzma.compress}[compress]
    ext = f".{compress}" if compress else ""
    mirror(root, subdir="")
    (root / "train.jsonl").unlink()
    if kind == "plain":
        (root / f"train.zh{ext}").write_bytes(pack("".join(z + "\n" for z, _ in train).encode()))
        (root / f"train.en{ext}").write_bytes(pack("".join(e + "\n" for _, e in train).encode()))
    elif kind == "tsv":
        (root / f"train.tsv{ext}").write_bytes(pack("".join(f"{z}\t{e}\n" for z, e in train).encode()))
    else:
        (root / f"train.jsonl{ext}").write_bytes(pack(write_jsonl(root / "raw", train).read_bytes()))
        (root / "raw").unlink()
    return root


@pytest.mark.parametrize("kind", ["jsonl", "tsv", "plain"])
@pytest.mark.parametrize("compress", ["gz", "xz"])
def test_compressed_local_files_give_the_corpus_of_plain_ones(tmp_path, monkeypatch, kind, compress):
    _many_units(monkeypatch)
    train = _noisy_train(300)
    prepare_corpus(config(workers=2), tmp_path / "a", mirror=str(_formats(tmp_path / "plain", train, kind, "")))
    stats = prepare_corpus(
        config(workers=2), tmp_path / "b", mirror=str(_formats(tmp_path / "c", train, kind, compress))
    )
    a, b = _corpus_bytes(tmp_path / "a/corpus"), _corpus_bytes(tmp_path / "b/corpus")
    assert a.keys() == b.keys() and {k: v for k, v in a.items() if k.startswith("train")} == {
        k: v for k, v in b.items() if k.startswith("train")
    }
    assert stats["train"]["source"].endswith(f".{compress}") and stats["train"]["kept"] > 300


def test_bad_lines_of_plain_files_are_counted_by_reason(tmp_path, monkeypatch):
    _many_units(monkeypatch)
    root = mirror(tmp_path / "m", subdir="")
    (root / "train.jsonl").unlink()
    train = _noisy_train(300)
    zh = [z.encode() for z, _ in train]
    en = [e.encode() for _, e in train]
    zh[10], en[150], zh[250] = b"\xff\xfe", b"a\x00b", "长".encode() * (4 << 20)
    (root / "train.zh").write_bytes(b"\n".join(zh) + b"\n")
    (root / "train.en").write_bytes(b"\n".join(en) + b"\n")
    with warns(r"train\.zh\+\.en:11: invalid UTF-8 \(skipped 3 bad lines\)"):
        stats = prepare_corpus(config(workers=2), tmp_path / "run", mirror=str(root))
    assert stats["train"]["bad_lines"] == {
        "NUL byte": {"count": 1, "first_line": 151},
        "invalid UTF-8": {"count": 1, "first_line": 11},
        "line longer than 1 MiB": {"count": 1, "first_line": 251},
    }
    check_invariant(stats)


def test_plain_files_that_differ_stop_before_any_work(tmp_path):
    root = _formats(tmp_path / "m", TRAIN, "plain", "gz")
    (root / "train.en.gz").write_bytes(__import__("gzip").compress(b"one\ntwo\n"))
    with pytest.raises(
        NmtError, match=r"train\.zh\.gz has 4 lines but .*train\.en\.gz has 2: parallel files must align"
    ):
        prepare_corpus(config(), tmp_path / "run", mirror=str(root))
    assert not (tmp_path / "run").exists()  # nothing read, nothing written


def test_synthetic_pairs_are_cleaned_in_units_and_the_first_max_pairs_appended(tmp_path, monkeypatch):
    from nmt.config import BT_TAG

    _many_units(monkeypatch)
    synthetic = [(f"合成句子{i}。", f"Synthetic sentence {i}.") for i in range(400)]
    synthetic += synthetic[:50] + [VALID[0], ("", "Empty.")]  # repeats, an overlap with valid, an empty side
    write_jsonl(tmp_path / "bt" / "train.jsonl", synthetic)
    bt = {"corpus": str(tmp_path / "bt"), "tag": True, "real_upsample": 2, "max_pairs": 300, "ratio": None}
    root = mirror(tmp_path / "m")
    stats = prepare_corpus(config(backtranslation=bt, workers=2), tmp_path / "run", mirror=str(root))
    zh = lines(tmp_path / "run/corpus/train.zh")
    assert zh[: 2 * len(TRAIN)] == [z for z, _ in TRAIN for _ in range(2)]  # real pairs, each twice
    assert zh[2 * len(TRAIN) :] == [f"{BT_TAG} 合成句子{i}。" for i in range(300)]  # the first 300, tagged
    s = stats["backtranslation"]
    assert s["kept"] == 300 and s["dropped"]["duplicate"] == 50 and s["dropped"]["subsampled"] == 100
    assert s["dropped"]["overlap"] == 1 and s["dropped"]["empty"] == 1 and s["read"] == len(synthetic)


def test_synthetic_only_rules_count_their_drops_and_real_lines_bound_the_synthetic_ones(tmp_path):
    """Each synthetic-only rule drops its pair and is counted by reason; then at most
    ratio × real lines (real_upsample copies count) are kept, drawn with the data seed."""
    good = [(f"合成句子{i}。", f"Synthetic sentence {i}.") for i in range(20)]
    bad = [
        ("好。", "This is good, really very good."),  # bt_ratio: 5.2, under data.max_ratio 9
        ("我把把把把你。", "I hold you close."),  # char_run: 把 four times
        ("我的的我的的我的的。", "Mine of mine of mine."),  # token_share: 的 6 of 9
    ]
    write_jsonl(tmp_path / "bt" / "train.jsonl", good[:10] + bad + good[10:])
    bt = {"corpus": str(tmp_path / "bt"), "tag": False, "real_upsample": 2}
    root = mirror(tmp_path / "m")
    stats = prepare_corpus(config(backtranslation=bt), tmp_path / "run", mirror=str(root))
    s = stats["backtranslation"]
    assert {k: s["dropped"][k] for k in ("bt_ratio", "char_run", "token_share")} == dict.fromkeys(
        ("bt_ratio", "char_run", "token_share"), 1
    )
    real = 2 * len(TRAIN)
    assert s["kept"] == real and s["dropped"]["real_ratio"] == len(good) - real and s["read"] == 23
    kept = lines(tmp_path / "run/corpus/train.zh")[real:]
    assert len(kept) == real and set(kept) <= {z for z, _ in good} and kept != [z for z, _ in good[:real]]
    again = prepare_corpus(config(backtranslation=bt, seed=5), tmp_path / "run2", mirror=str(root))
    assert again["backtranslation"]["kept"] == real and lines(tmp_path / "run2/corpus/train.zh")[real:] != kept
    loose = bt | {"ratio": None, "max_ratio": 9.0, "max_char_run": 0, "max_token_share": 1.0}
    every = prepare_corpus(config(backtranslation=loose), tmp_path / "run3", mirror=str(root))
    assert every["backtranslation"]["kept"] == len(good) + len(bad)  # each rule off


def test_the_number_of_workers_is_not_part_of_the_stamp(tmp_path):
    from nmt.config import stamp_sections

    assert "workers" not in stamp_sections(config(workers=3))["data"]  # no stage is redone for it (vocab too)
    root = mirror(tmp_path / "m")
    prepare_corpus(config(workers=1), tmp_path / "run", mirror=str(root))
    stamp = tmp_path / "run/download.stamp.json"
    os.utime(stamp, ns=(10**9, 10**9))  # back-dated: a rewrite would show, whatever the clock's resolution
    before = stamp.stat().st_mtime_ns
    prepare_corpus(config(workers=2), tmp_path / "run", mirror=str(root))
    assert stamp.stat().st_mtime_ns == before  # the same corpus: skipped
    prepare_corpus(config(workers=2, seed=9), tmp_path / "run", mirror=str(root))
    assert stamp.stat().st_mtime_ns != before  # a setting that matters: redone


def test_a_negative_worker_count_is_a_config_error():
    from nmt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data\.workers.*must be >= 0"):
        config(workers=-1)

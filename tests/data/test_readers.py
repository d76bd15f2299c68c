"""The split readers on their own; tests/test_corpus.py covers them through prepare_corpus."""

import json

import pytest
from conftest import warns

from nmt.config import DataConfig
from nmt.data.readers import Source, find_sources, read_split
from nmt.data.recipes import RECIPES, BadLines, get_recipe
from nmt.errors import NmtError


def test_jsonl_reader_streams_pairs_and_counts_bad_lines(tmp_path):
    path = tmp_path / "train.jsonl"
    good = json.dumps({"translation": {"zh": "你好", "en": "Hello"}}, ensure_ascii=False).encode()
    path.write_bytes(b"\n".join([good, b"{oops", b'{"translation": {"zh": "x"}}', b"\xff\xfe", good]) + b"\n")
    bad = BadLines(str(path))
    source = Source("jsonl", (path,), str(path))
    rows = list(read_split(source, RECIPES["tatoeba"], DataConfig(), bad))
    assert rows == [(1, "你好", "Hello"), (5, "你好", "Hello")]
    assert bad.count == 3 and bad.first == 2 and bad.reason == "invalid JSON"
    with warns(r"train\.jsonl:2: invalid JSON \(skipped 3 bad lines\)"):
        bad.warn()


def test_tsv_and_plain_mirrors_are_found(tmp_path):
    (tmp_path / "train.tsv").write_text("我爱你。\tI love you.\n", encoding="utf-8")
    (tmp_path / "valid.zh").write_text("你好\n", encoding="utf-8")
    (tmp_path / "valid.en").write_text("Hi\n", encoding="utf-8")
    sources = find_sources(get_recipe("tatoeba"), DataConfig(), mirror=str(tmp_path))
    assert sources["train"].kind == "tsv" and sources["valid"].kind == "plain" and sources["test"].kind == "none"
    rows = list(read_split(sources["valid"], RECIPES["tatoeba"], DataConfig(), BadLines("v")))
    assert rows == [(1, "你好", "Hi")]


def test_unknown_recipe_suggests_closest():
    with pytest.raises(NmtError, match=r"unknown corpus 'wmt91' \(did you mean 'wmt19'\?\)"):
        get_recipe("wmt91")


def test_every_brief_recipe_exists():
    assert {"tatoeba", "wmt19", "wmt17", "opus100", "iwslt2017", "news_commentary"} <= set(RECIPES)


# --------------------------------------------------------------------------- a UTF-8 byte-order mark


BOM = "\ufeff".encode()


def test_bom_is_ignored_in_jsonl_tsv_and_plain_files(tmp_path):
    record = json.dumps({"translation": {"zh": "你好", "en": "Hello"}}, ensure_ascii=False)
    (tmp_path / "a.jsonl").write_bytes(BOM + record.encode() + b"\n")
    (tmp_path / "a.tsv").write_bytes(BOM + "你好\tHello\n".encode())
    (tmp_path / "a.zh").write_bytes(BOM + "你好\n".encode())
    (tmp_path / "a.en").write_bytes(BOM + b"Hello\n")
    sources = [
        Source("jsonl", (tmp_path / "a.jsonl",), "a.jsonl"),
        Source("tsv", (tmp_path / "a.tsv",), "a.tsv"),
        Source("plain", (tmp_path / "a.zh", tmp_path / "a.en"), "a.zh"),
    ]
    for source in sources:
        bad = BadLines(source.label)
        assert list(read_split(source, RECIPES["tatoeba"], DataConfig(), bad)) == [(1, "你好", "Hello")], source.kind
        assert bad.count == 0


def test_bom_only_at_the_start_of_a_file(tmp_path):
    """A BOM later in a file is text (U+FEFF), not a marker; it is kept as the file has it."""
    (tmp_path / "a.tsv").write_bytes("你好\tHello\n".encode() + BOM + "再见\tBye\n".encode())
    rows = list(read_split(Source("tsv", (tmp_path / "a.tsv",), "a"), RECIPES["tatoeba"], DataConfig(), BadLines("a")))
    assert rows == [(1, "你好", "Hello"), (2, "\ufeff再见", "Bye")]


def test_a_line_over_the_limit_is_cut_short_and_the_next_line_read(tmp_path, monkeypatch):
    import io

    from nmt.data import readers

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 100)
    f = io.BytesIO(b"short\n" + b"x" * 350 + b"\n" + b"y" * 101 + b"\nlast" + b"z" * 300)
    lines = list(readers.bounded_lines(f))
    assert lines == [b"short\n", b"x" * 101, b"y" * 101, b"last" + b"z" * 97]
    reasons = [readers.decode_line(line, False)[1] for line in lines]
    assert reasons[0] == "" and all(r.startswith("line longer than") for r in reasons[1:])


def test_a_file_without_line_breaks_is_one_bad_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes(b"a\tb\n" + b"\xe9\x95\xbf" * (4 << 20))  # 12 MB, no final line break
    bad = BadLines(str(path))
    rows = list(read_split(Source("tsv", (path,), str(path)), RECIPES["tatoeba"], DataConfig(), bad))
    assert rows == [(1, "a", "b")] and bad.summary() == {"line longer than 1 MiB": {"count": 1, "first_line": 2}}

"""scripts/span_sets.py: the raw path's span sets, from a mirror laid out as the real one."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from conftest import ROOT

spec = importlib.util.spec_from_file_location("span_sets", ROOT / "scripts" / "span_sets.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)

WITH = [("我叫Kovemi。", "My name is Kovemi."), ("他有47本书。", "He has 47 books.")]
WITHOUT = [("我爱你。", "I love you."), ("我叫Kovemi。", "My name is Tom.")]  # no span; a span on one side only
SEVERAL = [("Terry Tate先生来了。", "Mr Terry Tate came."), ("Ally和Anne在玩。", "Ally and Anne are playing.")]


def jsonl(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (json.dumps({"translation": {"zh": zh, "en": en}}, ensure_ascii=False) for zh, en in pairs)
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")


def plain(folder: Path, stem: str, pairs: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("zh", "en")):
        (folder / f"{stem}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_each_set_holds_the_lines_whose_sides_share_a_span(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(script, "MIRROR_LINES", 2)  # of the 4 mirror lines with spans: 2 drawn, then the rest
    mirror, out = tmp_path / "mirror", tmp_path / "spans"
    jsonl(mirror / "tatoeba-zh-en" / "validation.jsonl", WITH + WITHOUT)
    jsonl(mirror / "tatoeba-zh-en" / "test.jsonl", WITHOUT + WITH[:1])
    long = ("这是一个很长的句子，" * 5 + "共有47个字。", "A long sentence of 47 characters.")
    jsonl(mirror / "wmt-news-zh-en" / "validation.jsonl", [long, WITH[1]])
    for i, (folder, stem) in enumerate(script.PLAIN):
        plain(mirror / folder, stem, WITHOUT + (WITH + SEVERAL if i == 0 else []))
    assert script.main(["--mirror", str(mirror), "--out", str(out)]) == 0

    assert lines(out / "valid.zh") == [zh for zh, _ in WITH]
    assert lines(out / "valid.en") == [en for _, en in WITH]
    assert lines(out / "test.zh") == [WITH[0][0]]
    assert lines(out / "news40.zh") == [WITH[1][0]]  # the line of over 40 characters left out
    drawn, words = lines(out / "mirror.zh"), lines(out / "mirror-words.zh")
    assert len(drawn) == 2 and set(drawn) < {zh for zh, _ in WITH + SEVERAL}
    rest = {zh for zh, _ in WITH + SEVERAL} - set(drawn)
    assert words and set(words) == rest & {zh for zh, _ in SEVERAL}  # the rest, those of several words only
    printed = capsys.readouterr().out
    assert "valid" in printed and "2 lines" in printed


def test_several_words_are_a_spaced_span_or_two_latin_ones():
    data = script.load_config(str(ROOT / "configs" / "small.yaml")).data
    found = script.with_spans(iter(WITH + SEVERAL), data)
    assert [script.several_words(p) for p in found] == [False, False, True, True]

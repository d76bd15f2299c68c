"""Validation and test splits named in the config (`data.valid`, `data.test`: `readers.path_source`)
and wmt19's test set (newstest2019) from a mirror folder, as sacreBLEU's `--echo` writes it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import warns
from synthetic import pairs, write_plain

from nmt.config import config_from_dict
from nmt.data.corpus import prepare_corpus
from nmt.errors import ConfigError, NmtError

TRAIN, VALID, TEST = pairs(60, seed=1), pairs(8, seed=2), pairs(6, seed=3)


def jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"translation": {"zh": z, "en": e}}, ensure_ascii=False) + "\n" for z, e in rows)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def wmt19_mirror(root: Path, test: bool) -> Path:
    """A mirror folder of wmt19 (`<mirror>/wmt19-zh-en/`), newstest2019 as the two files sacreBLEU echoes."""
    folder = root / "wmt19-zh-en"
    jsonl(folder / "train.jsonl", TRAIN)
    jsonl(folder / "validation.jsonl", VALID)
    if test:
        write_plain(folder, "test", TEST)
    return root


def prepare(tmp_path: Path, name: str, mirror: Path, **data) -> tuple[dict, Path]:
    config = config_from_dict({"name": "t", "data": {"corpus": "wmt19", "workers": 1, **data}})
    stats = prepare_corpus(config, tmp_path / name, mirror=str(mirror))
    return stats, tmp_path / name / "corpus"


def test_wmt19_test_set_from_the_mirror_folder(tmp_path):
    stats, out = prepare(tmp_path, "run", wmt19_mirror(tmp_path / "m", test=True))
    assert lines(out / "test.zh") == [z for z, _ in TEST] and lines(out / "test.en") == [e for _, e in TEST]
    assert stats["test"]["kept"] == len(TEST) and stats["test"]["source"].endswith("test.zh+.en")


def test_wmt19_without_a_test_set_warns_and_writes_it_empty(tmp_path):
    with warns("'wmt19' has no test split"):
        stats, out = prepare(tmp_path, "run", wmt19_mirror(tmp_path / "m", test=False))
    assert lines(out / "test.zh") == [] and stats["test"]["kept"] == 0


@pytest.mark.parametrize("form", ["plain", "tsv", "jsonl.gz"])
def test_a_test_set_by_path_in_any_format(tmp_path, form):
    """`data.test`: newstest2019 as sacreBLEU's two files, pasted into a TSV, or compressed JSONL."""
    mirror = wmt19_mirror(tmp_path / "m", test=False)
    if form == "plain":
        path = write_plain(tmp_path / "sets", "newstest2019", TEST)[0]
    elif form == "tsv":
        path = tmp_path / "newstest2019.tsv"
        path.write_text("".join(f"{z}\t{e}\n" for z, e in TEST), encoding="utf-8")
    else:
        path = jsonl(tmp_path / "newstest2019.jsonl.gz", TEST)
    stats, out = prepare(tmp_path, "run", mirror, test=str(path))
    assert lines(out / "test.zh") == [z for z, _ in TEST] and lines(out / "test.en") == [e for _, e in TEST]
    assert stats["test"]["source"].startswith(str(path))


def test_a_named_validation_file_wins_over_the_corpus_split_and_guards_train(tmp_path):
    mirror = wmt19_mirror(tmp_path / "m", test=True)
    valid = jsonl(tmp_path / "dev.jsonl", TRAIN[:3])  # sentences of train: the overlap guard drops them there
    stats, out = prepare(tmp_path, "run", mirror, valid=str(valid))
    assert lines(out / "valid.zh") == [z for z, _ in TRAIN[:3]]
    assert stats["train"]["dropped"]["overlap"] == 3 and stats["train"]["kept"] == len(TRAIN) - 3
    _, again = prepare(tmp_path, "run", mirror)  # the stamp covers the key: back to the corpus's split
    assert lines(again / "valid.zh") == [z for z, _ in VALID]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "none.tsv", r"data.test: .*none.tsv not found"),
        (lambda d: write_plain(d, "half", TEST)[0].with_suffix(".zh"), None),
        (lambda d: (d / "x.txt", (d / "x.txt").write_text("a\n"))[0], r"data.test: .*x.txt: expected .jsonl, .tsv"),
        (lambda d: (d / "one.zh", (d / "one.zh").write_text("你好\n"))[0], r"data.test: .*one.en not found"),
        (lambda d: (d / "empty", (d / "empty").mkdir())[0], r"data.test: .*empty has no test file"),
    ],
    ids=["missing", "pair", "suffix", "half-pair", "empty-folder"],
)
def test_a_bad_test_path_is_one_line_naming_the_key(tmp_path, make, message):
    mirror = wmt19_mirror(tmp_path / "m", test=False)
    (tmp_path / "d").mkdir()
    path = make(tmp_path / "d")
    if message is None:  # the good case of the table: both sides there
        assert prepare(tmp_path, "run", mirror, test=str(path))[0]["test"]["kept"] == len(TEST)
        return
    with pytest.raises(NmtError, match=message) as err:
        prepare(tmp_path, "run", mirror, test=str(path))
    assert "\n" not in str(err.value)


def test_an_empty_test_path_is_a_config_error():
    with pytest.raises(ConfigError, match="data.test: is empty"):
        config_from_dict({"data": {"test": ""}})

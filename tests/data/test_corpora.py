"""nmt.data.corpora: several training corpora in one config (`data.corpora`), each with a weight;
dedup and the overlap guard across them; the same bytes on any number of workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import warns
from synthetic import pairs, write_plain

from nmt.config import DataConfig, config_from_dict, config_to_yaml
from nmt.data import units
from nmt.data.corpus import prepare_corpus
from nmt.data.normalize import normalize_source
from nmt.errors import ConfigError, NmtError

ALL = pairs(440, seed=11)  # distinct English throughout
MAIN, MINE, VALID, TEST = ALL[:300], ALL[300:420], ALL[420:430], ALL[430:]
SHARED = MAIN[:5]  # pairs in both corpora: kept in the first, duplicates in the second
IN_VALID = MINE[:2]  # pairs of the second corpus that are validation pairs: dropped by the overlap guard


def jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"translation": {"zh": z, "en": e}}, ensure_ascii=False) + "\n" for z, e in rows),
        encoding="utf-8",
    )


@pytest.fixture
def inputs(tmp_path) -> tuple[Path, Path]:
    """A mirror with wmt19 (train, validation, test) and a folder of my own plain files."""
    folder = tmp_path / "m" / "wmt19-zh-en"
    jsonl(folder / "train.jsonl", MAIN)
    jsonl(folder / "validation.jsonl", VALID + IN_VALID)
    jsonl(folder / "test.jsonl", TEST)
    write_plain(tmp_path / "mine", "train", MINE + SHARED)
    return tmp_path / "m", tmp_path / "mine"


def prepare(tmp_path: Path, name: str, mirror: Path, corpora: list, **data) -> dict:
    raw = {"name": "t", "data": {"corpus": "wmt19", "workers": 1, "corpora": corpora, **data}}
    return prepare_corpus(config_from_dict(raw), tmp_path / name, mirror=str(mirror))


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_weights_repeat_each_corpus_exactly_and_the_report_counts_each(tmp_path, inputs):
    mirror, mine = inputs
    stats = prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"path": str(mine), "weight": 3}])
    first, second = stats["train"]["corpora"]
    assert (first["corpus"], first["weight"], first["kept"]) == ("wmt19", 1, len(MAIN))
    assert second["dropped"]["duplicate"] == len(SHARED) and second["dropped"]["overlap"] == len(IN_VALID)
    assert second["kept"] == len(MINE) - len(IN_VALID) and second["pairs"] == 3 * second["kept"]
    zh = lines(tmp_path / "run/corpus/train.zh")
    assert len(zh) == stats["train"]["pairs"] == len(MAIN) + 3 * second["kept"]
    cleaned = [normalize_source(z, DataConfig()) for z, _ in MAIN + MINE]
    assert zh[: len(MAIN)] == cleaned[: len(MAIN)]  # corpus order, then each pair of mine three times in a row
    assert zh[len(MAIN) : len(MAIN) + 3] == [cleaned[len(MAIN) + 2]] * 3
    assert stats["train"]["read"] == stats["train"]["kept"] + sum(stats["train"]["dropped"].values())
    assert stats["train"]["kept"] == first["kept"] + second["kept"]
    assert lines(tmp_path / "run/corpus/valid.zh") == [z for z, _ in VALID + IN_VALID]  # from data.corpus

    once = prepare(tmp_path, "once", mirror, [{"corpus": "wmt19"}, {"path": str(mine), "weight": 1}])
    assert stats["train"]["pairs"] - once["train"]["pairs"] == 2 * second["kept"]  # the weight, exactly
    assert once["train"]["kept"] == stats["train"]["kept"]


def test_the_order_of_the_corpora_decides_which_copy_of_a_duplicate_is_kept(tmp_path, inputs):
    mirror, mine = inputs
    stats = prepare(tmp_path, "run", mirror, [{"path": str(mine), "weight": 2}, {"corpus": "wmt19"}])
    first, second = stats["train"]["corpora"]
    assert first["dropped"]["duplicate"] == 0 and second["dropped"]["duplicate"] == len(SHARED)
    assert stats["train"]["kept"] == len(MAIN) + len(MINE) - len(IN_VALID)


def test_one_or_two_workers_give_the_same_bytes(tmp_path, inputs, monkeypatch):
    mirror, mine = inputs
    monkeypatch.setattr(units, "UNIT_BYTES", 4096)
    monkeypatch.setattr(units, "UNIT_LINES", 40)
    corpora = [{"corpus": "wmt19", "weight": 2}, {"path": str(mine), "weight": 2.5}]
    one = prepare(tmp_path, "one", mirror, corpora, max_train_pairs=200)
    two = prepare(tmp_path, "two", mirror, corpora, max_train_pairs=200, workers=2)
    assert one == two and one["train"]["kept"] == 200
    assert sum(c["dropped"]["subsampled"] for c in one["train"]["corpora"]) > 0
    for name in ("train.zh", "train.en", "manifest.json"):
        assert (tmp_path / "one/corpus" / name).read_bytes() == (tmp_path / "two/corpus" / name).read_bytes()


def test_without_corpora_the_single_corpus_report_is_unchanged(tmp_path, inputs):
    mirror, _ = inputs
    stats = prepare(tmp_path, "run", mirror, [])
    assert "corpora" not in stats["train"] and stats["train"]["kept"] == len(MAIN)
    assert set(stats["train"]) == {"source", "read", "kept", "dropped", "bad_lines"}


def test_the_resolved_config_is_saved_and_read_back(tmp_path):
    raw = {"data": {"corpus": "wmt19", "corpora": [{"corpus": "wmt19"}, {"path": "my/files", "weight": 3}]}}
    config = config_from_dict(raw)
    again = config_from_dict(yaml.safe_load(config_to_yaml(config)))
    assert again.data.corpora == config.data.corpora and again.data.corpora[1].weight == 3


@pytest.mark.parametrize(
    ("corpora", "message"),
    [
        ([{"corpus": "wmt19"}, {"path": "x", "weight": 0}], r"data.corpora\[1\].weight: 0.0 must be at least 1"),
        ([{"corpus": "wmt19", "path": "x"}], r"data.corpora\[0\]: give either corpus: NAME or path: DIR"),
        ([{"path": "x", "weigth": 2}], r"unknown key data.corpora\[0\].weigth \(did you mean 'weight'\?\)"),
        ([{"path": "x", "weight": 0.5}], r"data.corpora\[0\].weight: 0.5 must be at least 1"),
        ([{"path": "x", "weight": "x"}], r"data.corpora\[0\].weight: expected float, got 'x'"),
        ("wmt19", r"data.corpora\[0\]: expected CorpusEntry, got 'wmt19'"),
    ],
)
def test_bad_corpora_are_one_line_config_errors_naming_the_key(corpora, message):
    with pytest.raises(ConfigError, match=message) as err:
        config_from_dict({"data": {"corpus": "wmt19", "corpora": corpora}})
    assert "\n" not in str(err.value)


def test_corpora_without_data_corpus_is_refused():
    """Valid and test come from data.corpus: left out, they would quietly be the default's (tatoeba)."""
    with pytest.raises(ConfigError, match="data.corpora: also name data.corpus"):
        config_from_dict({"data": {"corpora": [{"corpus": "wmt19"}]}})


def test_a_missing_path_is_one_line_naming_the_entry(tmp_path, inputs):
    mirror, _ = inputs
    with pytest.raises(NmtError, match=r"data.corpora\[1\].path: .*nowhere not found"):
        prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"path": str(tmp_path / "nowhere")}])
    assert not (tmp_path / "run" / "corpus" / "train.zh").exists()


def test_an_unknown_recipe_is_one_line_naming_the_entry_before_any_work(tmp_path, inputs):
    mirror, _ = inputs
    message = r"data.corpora\[1\].corpus: unknown corpus 'wmt91' \(did you mean 'wmt19'\?\)"
    with pytest.raises(NmtError, match=message) as err:
        prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"corpus": "wmt91"}])
    assert "\n" not in str(err.value) and not (tmp_path / "run" / "corpus").exists()


def test_a_hub_corpus_among_them_is_downloaded_once(tmp_path, inputs, monkeypatch):
    from fake_hub import FakeHub, translation_rows

    _, mine = inputs
    tables = {
        ("wmt/wmt19", "zh-en", "train"): translation_rows(MAIN),
        ("wmt/wmt19", "zh-en", "validation"): translation_rows(VALID),
    }
    hub = FakeHub(monkeypatch, tmp_path / "hf", tables)
    raw = {"name": "t", "data": {"corpus": "wmt19", "workers": 1}}
    raw["data"]["corpora"] = [{"path": str(mine), "weight": 2}, {"corpus": "wmt19"}]
    with warns("'wmt19' has no test split"):
        first = prepare_corpus(config_from_dict(raw), tmp_path / "a")
    expected = [f"zh-en/{split}-{i:05d}-of-00002.parquet" for split in ("train", "validation") for i in (0, 1)]
    assert sorted(hub.downloads) == expected  # two files a split, each once
    mine_stats, hub_stats = first["train"]["corpora"]
    assert mine_stats["kept"] == len(MINE) + len(SHARED) and mine_stats["pairs"] == 2 * mine_stats["kept"]
    assert hub_stats["kept"] == len(MAIN) - len(SHARED) and hub_stats["dropped"]["duplicate"] == len(SHARED)
    hub.downloads.clear()
    with warns("no test split"):
        second = prepare_corpus(config_from_dict(raw), tmp_path / "b")
    assert hub.downloads == [] and second == first


def test_the_printed_report_has_a_row_per_corpus(tmp_path, inputs):
    import io

    from rich.console import Console

    from nmt.data.corpus import print_stats

    mirror, mine = inputs
    stats = prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"path": str(mine), "weight": 3}])
    out = io.StringIO()
    print_stats(stats, Console(file=out, width=200))
    rows = [line for line in out.getvalue().splitlines() if line.startswith(("│ wmt19", f"│ {mine}"))]
    second = stats["train"]["corpora"][1]
    assert len(rows) == 2 and rows[1].split("│")[-2].strip() == str(second["pairs"])


def test_a_recipe_missing_from_the_mirror_is_one_line_naming_the_entry(tmp_path, inputs):
    """Not the mirror's top folder instead: that would be another corpus's files."""
    mirror, _ = inputs
    message = r"data.corpora\[1\].corpus: 'opus100': the mirror .* has no folder opus100-en-zh"
    with pytest.raises(NmtError, match=message):
        prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"corpus": "opus100"}])


def test_a_fractional_weight_repeats_a_seeded_share_of_the_pairs_once_more(tmp_path, inputs):
    mirror, mine = inputs
    stats = prepare(tmp_path, "run", mirror, [{"path": str(mine), "weight": 1.5}, {"corpus": "wmt19"}])
    first = stats["train"]["corpora"][0]
    zh = lines(tmp_path / "run/corpus/train.zh")
    assert len(zh) == stats["train"]["pairs"] == first["pairs"] + len(MAIN) - len(SHARED)
    assert 0.3 * first["kept"] < first["pairs"] - first["kept"] < 0.7 * first["kept"]  # about half twice
    mine_lines = zh[: first["pairs"]]
    twice = {z for z in mine_lines if mine_lines.count(z) == 2}
    assert len(twice) == first["pairs"] - first["kept"] and len(set(mine_lines)) == first["kept"]
    again = prepare(tmp_path, "again", mirror, [{"path": str(mine), "weight": 1.5}, {"corpus": "wmt19"}], seed=2)
    other = lines(tmp_path / "again/corpus/train.zh")[: again["train"]["corpora"][0]["pairs"]]
    assert {z for z in other if other.count(z) == 2} != twice  # the seed picks the share


# --------------------------------------------------------------------------- noise filters, eval sets, recipes

NOISY = [
    ("详见 http://example.org", "<br/>"),  # markup: the English side is only a tag
    ("我们走吧。", "我们走吧。"),  # identical: not translated
    ("Let us go now", "Let us go now!"),  # identical but for punctuation
    ("We should leave now please", "Let us go now"),  # script: English on the Chinese side
    ("好的", "好的 ok"),  # script: Chinese on the English side
    ("一", "This sentence is far far far far far far far far far too long for one character"),  # ratio
]
NEAR = [(MINE[5][0].replace("。", "！"), MINE[5][1].upper())]  # a near-duplicate of MINE[5]
STRICT = {"markup": True, "identical": True, "script": 0.5, "near_dup": True, "max_ratio": 6.0}


def test_each_noise_filter_drops_its_pairs_and_counts_them_by_name(tmp_path, inputs):
    mirror, mine = inputs
    write_plain(tmp_path / "noisy", "train", MINE[3:] + NOISY + NEAR)
    corpora = [{"corpus": "wmt19"}, {"path": str(tmp_path / "noisy"), "filters": STRICT}]
    stats = prepare(tmp_path, "run", mirror, corpora)
    first, second = stats["train"]["corpora"]
    expected = {"markup": 1, "identical": 2, "script": 2, "ratio": 1, "near_duplicate": 1}
    assert {k: second["dropped"][k] for k in expected} == expected
    assert second["kept"] == len(MINE) - 3  # every clean pair kept
    assert all(first["dropped"][k] == 0 for k in expected)  # wmt19 has its own (default) filters: off
    assert stats["train"]["read"] == stats["train"]["kept"] + sum(stats["train"]["dropped"].values())
    train_en = set(lines(tmp_path / "run/corpus/train.en"))
    assert not train_en & {e for _, e in NOISY + NEAR}

    off = prepare(tmp_path, "off", mirror, [{"corpus": "wmt19"}, {"path": str(tmp_path / "noisy")}])
    dropped = off["train"]["corpora"][1]["dropped"]
    assert dropped["ratio"] == 2 and dropped["markup"] == dropped["identical"] == dropped["script"] == 0
    # filters off: the default ratio limit (9) still drops the one-character line and the bare tag; the rest pass
    assert off["train"]["corpora"][1]["kept"] == second["kept"] + len(NOISY) + len(NEAR) - 2


def test_data_filters_apply_to_every_corpus_without_its_own(tmp_path, inputs):
    mirror, _ = inputs
    write_plain(tmp_path / "noisy", "train", MINE[3:] + NOISY)
    corpora = [{"corpus": "wmt19"}, {"path": str(tmp_path / "noisy")}]
    stats = prepare(tmp_path, "run", mirror, corpora, filters={"identical": True})
    assert stats["train"]["corpora"][1]["dropped"]["identical"] == 2
    assert stats["train"]["corpora"][1]["dropped"]["script"] == 0


def test_near_duplicates_are_found_across_corpora_that_ask_for_it(tmp_path, inputs):
    mirror, _ = inputs
    twin = [(MAIN[7][0] + "！", MAIN[7][1].lower())]
    write_plain(tmp_path / "twin", "train", MINE[3:] + twin)
    near = {"near_dup": True}
    stats = prepare(tmp_path, "run", mirror, [{"corpus": "wmt19", "filters": near}, {"path": str(tmp_path / "twin")}])
    assert stats["train"]["corpora"][1]["dropped"]["near_duplicate"] == 0  # the second corpus did not ask
    both = [{"corpus": "wmt19", "filters": near}, {"path": str(tmp_path / "twin"), "filters": near}]
    stats = prepare(tmp_path, "both", mirror, both)
    second = stats["train"]["corpora"][1]
    assert second["dropped"]["near_duplicate"] == 1 and second["dropped"]["duplicate"] == 0


def test_eval_sets_are_written_and_guarded_against_like_test(tmp_path, inputs):
    mirror, mine = inputs
    news = ALL[300:306]  # pairs of my corpus that a second test set holds
    jsonl(mirror / "wmt-news-zh-en" / "test.jsonl", news)
    sets = [{"corpus": "wmt_news", "split": "test"}]
    stats = prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"path": str(mine)}], eval_sets=sets)
    assert lines(tmp_path / "run/corpus/wmt_news.test.en") == [e for _, e in news]
    assert stats["eval_sets"]["wmt_news.test"]["kept"] == len(news)
    second = stats["train"]["corpora"][1]
    assert second["dropped"]["overlap"] == len(set(news) | set(IN_VALID))  # news and validation, both guarded
    assert not set(lines(tmp_path / "run/corpus/train.en")) & {e for _, e in news}


def test_a_missing_eval_set_stops_before_any_work_naming_the_entry(tmp_path, inputs):
    mirror, mine = inputs
    sets = [{"corpus": "aichallenger", "split": "valid"}]
    with pytest.raises(NmtError, match=r"data.eval_sets\[0\].corpus: 'aichallenger': .* no folder aichallenger-zh-en"):
        prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}], eval_sets=sets)
    assert not (tmp_path / "run" / "corpus.work").exists()


def test_two_eval_sets_with_one_name_are_refused():
    sets = [{"corpus": "wmt_news"}, {"path": "x/news.jsonl", "name": "wmt_news.test"}]
    with pytest.raises(ConfigError, match=r"data.eval_sets\[1\].name: 'wmt_news.test' names another set"):
        config_from_dict({"data": {"eval_sets": sets}})
    with pytest.raises(ConfigError, match=r"data.eval_sets\[0\].name: 'valid' is a split of the run"):
        config_from_dict({"data": {"eval_sets": [{"path": "x/valid.jsonl"}]}})


def youdao_mirror(root: Path) -> Path:
    folder = root / "youdao-examples-zh-en"
    folder.mkdir(parents=True)
    (folder / "coca.zh").write_text("".join(z + "\n" for z, _ in MINE), encoding="utf-8")
    (folder / "coca.en").write_text("".join(e + "\n" for _, e in MINE), encoding="utf-8")
    return folder


def test_a_mirror_recipe_reads_its_named_files_and_its_run_says_where_the_data_may_be_used(tmp_path, inputs):
    mirror, _ = inputs
    youdao_mirror(mirror)
    stats = prepare(tmp_path, "run", mirror, [{"corpus": "wmt19"}, {"corpus": "youdao_coca"}])
    assert stats["train"]["corpora"][1]["kept"] == len(MINE) - len(IN_VALID)
    assert stats["train"]["corpora"][1]["source"].endswith("coca.zh+.en")
    card = (tmp_path / "run/corpus/DATA.md").read_text(encoding="utf-8")
    assert card.startswith("# Training data\n\n**Research and benchmarking only.**")
    assert "| youdao_coca |" in card and stats["provenance"]["research_only"] is True
    clean = prepare(tmp_path, "clean", mirror, [{"corpus": "wmt19"}])
    assert clean["provenance"]["research_only"] is False
    assert "Research" not in (tmp_path / "clean/corpus/DATA.md").read_text(encoding="utf-8")


def test_a_run_fine_tuned_from_a_research_only_run_inherits_its_provenance(tmp_path, inputs):
    mirror, _ = inputs
    youdao_mirror(mirror)
    prepare(tmp_path, "mix", mirror, [{"corpus": "wmt19"}, {"corpus": "youdao_coca"}])
    raw = {"name": "t", "data": {"corpus": "wmt19", "workers": 1}}
    raw["train"] = {"init_from": str(tmp_path / "mix/checkpoints/averaged.safetensors")}
    stats = prepare_corpus(config_from_dict(raw), tmp_path / "tuned", mirror=str(mirror))
    assert stats["provenance"]["research_only"] is True
    assert [(e["corpus"], e.get("via")) for e in stats["provenance"]["corpora"]] == [
        ("wmt19", "train.init_from"),
        ("youdao_coca", "train.init_from"),
        ("wmt19", None),
    ]
    card = (tmp_path / "tuned/corpus/DATA.md").read_text(encoding="utf-8")
    assert "**Research and benchmarking only.**" in card
    assert "| youdao_coca (the weights it started from: train.init_from) |" in card
    raw["train"] = {"init_from": str(tmp_path / "nowhere/checkpoints/x.safetensors")}
    unknown = prepare_corpus(config_from_dict(raw), tmp_path / "unknown", mirror=str(mirror))
    assert unknown["provenance"]["corpora"][0]["licence"] == "not recorded"


@pytest.mark.parametrize("with_mirror", [True, False])
def test_a_mirror_only_recipe_without_its_folder_stops_in_one_line_naming_folder_and_mirror(
    tmp_path, inputs, with_mirror, monkeypatch
):
    mirror, _ = inputs
    monkeypatch.delenv("NMT_MIRROR", raising=False)
    raw = {"name": "t", "data": {"corpus": "wmt19", "workers": 1, "corpora": [{"corpus": "youdao_coca"}]}}
    where = str(mirror) if with_mirror else None
    with pytest.raises(NmtError) as e:
        prepare_corpus(config_from_dict(raw), tmp_path / "run", mirror=where)
    message = str(e.value)
    assert "\n" not in message and "youdao-examples-zh-en" in message and "NMT_MIRROR" in message
    assert message.startswith("data.corpora[0].corpus: 'youdao_coca'")
    assert not (tmp_path / "run" / "corpus").exists()

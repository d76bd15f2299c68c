"""nmt.data.vocab: two SentencePiece models with shared special ids, encoding of every split, stamps."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from conftest import warns

from nmt import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.config import ACCENTED_LETTERS, Config, config_from_dict
from nmt.data import vocab as vocab_module
from nmt.data.corpus import prepare_corpus
from nmt.data.encoded import ParallelSplit
from nmt.data.normalize import normalize_source, normalize_target
from nmt.data.passthrough import PLACEHOLDERS, Detector, mask_pair
from nmt.data.tokenizer import Tokenizer, load_tokenizers
from nmt.data.vocab import ACCENTED_CHARS, ASCII_CHARS, build_vocab
from nmt.errors import ConfigError, NmtError


def config(vocab: dict | None = None, **data) -> Config:
    vocab = {"src_size": 1200, "tgt_size": 600, "workers": 2, **(vocab or {})}
    return config_from_dict(
        {"name": "t", "data": {"corpus": "tatoeba", "max_train_pairs": 1500, **data}, "vocab": vocab}
    )


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[Config, Path, dict]:
    """A generated corpus with a real-sized character inventory (synthetic.vocab_pairs: 3,000 train lines
    → 1,500 pairs, 500 valid, 500 test), corpus + vocab built once and shared by the tests."""
    from synthetic import write_mirror

    root = tmp_path_factory.mktemp("real")
    write_mirror(root / "m", train=3000, valid=500, test=500, rich=True)
    cfg, run = config(), root / "run"
    prepare_corpus(cfg, run, mirror=str(root / "m"))
    return cfg, run, build_vocab(cfg, run)


@pytest.fixture(params=["generated", pytest.param("real", marks=pytest.mark.real_data)])
def first_lines(request, tmp_path) -> Path:
    """A mirror of 3,000 train, 500 valid and 500 test lines: generated with a real-sized character
    inventory, and the first lines of the real mirror where it exists."""
    from synthetic import write_mirror

    root = tmp_path / "m"
    if request.param == "generated":
        return write_mirror(root, train=3000, valid=500, test=500, rich=True)
    (root / "tatoeba-zh-en").mkdir(parents=True)
    for name, keep in (("train.jsonl", 3000), ("validation.jsonl", 500), ("test.jsonl", 500)):
        with open(request.getfixturevalue("shared_data") / "tatoeba-zh-en" / name, encoding="utf-8") as f:
            (root / "tatoeba-zh-en" / name).write_text("".join(itertools.islice(f, keep)), encoding="utf-8")
    return root


def test_validation_has_no_unk(first_lines, tmp_path):
    """Byte fallback leaves no <unk> on Traditional and rare characters."""
    root = first_lines
    cfg = config()
    prepare_corpus(cfg, tmp_path / "run", mirror=str(root))
    report = build_vocab(cfg, tmp_path / "run")
    assert report["zh"]["valid_unk_rate"] == 0.0 and report["zh"]["vocab_size"] == 1200
    ds = ParallelSplit.open(tmp_path / "run", "test", cfg)
    assert len(ds) == 500 and np.count_nonzero(ds.src_ids == UNK_ID) == 0


def copy_run(tmp_path: Path, real_run, with_vocab: bool = False) -> Path:
    """A copy of the shared run: its corpus only, or (with_vocab) also its models, arrays and stamp."""
    run = tmp_path / "run"
    if with_vocab:
        shutil.copytree(real_run[1], run)
    else:
        shutil.copytree(real_run[1] / "corpus", run / "corpus")
    return run


def test_both_models_share_the_special_ids(real_run):
    cfg, run, report = real_run
    src, tgt = load_tokenizers(run, cfg)
    for tok in (src, tgt):
        assert [tok.piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (src.vocab_size, tgt.vocab_size) == (1200, 600)
    assert report["zh"]["vocab_size"] == 1200 and report["en"]["vocab_size"] == 600
    assert BOS_ID not in src.encode("我爱你。") and EOS_ID not in tgt.encode("I love you.")


def test_the_report_times_each_step_and_prints_it(real_run, capsys):
    from rich.console import Console

    from nmt.data.vocab import print_report

    cfg, run, report = real_run
    assert list(report["seconds"]) == ["models", "encode"]
    assert all(s > 0 for s in report["seconds"].values())
    stamped = json.loads((run / "vocab.stamp.json").read_text(encoding="utf-8"))["report"]
    assert stamped["seconds"] == report["seconds"]  # what scripts/bench_preprocess.py reads
    print_report(report, ("zh", "en"), Console(file=None, force_terminal=False, width=120))
    assert f"encode {report['seconds']['encode']:,.1f} s" in capsys.readouterr().out


def test_zh_round_trips_after_normalisation(real_run):
    cfg, run, _ = real_run
    src, tgt = load_tokenizers(run, cfg)
    for text in ("我們說國語，好嗎？", "ＡＩ改變了世界 2024 年", "𠀀罕見字與 emoji 😀"):
        norm = normalize_source(text, cfg.data)
        assert src.decode(src.encode(norm)) == norm
    batch = ["Hello there.", "How are you?"]
    assert [tgt.decode(ids) for ids in tgt.encode_batch(batch)] == batch


def test_no_unk_on_real_validation_thanks_to_byte_fallback(real_run):
    cfg, run, report = real_run
    assert report["zh"]["valid_unk_rate"] == 0.0 and report["zh"]["byte_fallback"]
    assert report["zh"]["valid_pieces_per_sentence"] > 1
    for split in ("valid", "test"):  # test holds Traditional and rare characters
        ds = ParallelSplit.open(run, split, cfg)
        assert len(ds) > 0 and np.count_nonzero(ds.src_ids == UNK_ID) == 0


def test_binarized_arrays_decode_back_to_the_corpus(real_run):
    cfg, run, _ = real_run
    src, tgt = load_tokenizers(run, cfg)
    train = ParallelSplit.open(run, "train", cfg)
    train_zh, train_en = lines(run / "corpus/train.zh"), lines(run / "corpus/train.en")
    assert len(train) == len(train_zh) == 1500
    masked = [mask_pair(z, e, Detector.from_data(cfg.data)) for z, e in zip(train_zh, train_en, strict=True)]
    assert [src.decode(train.pair(i)[0].tolist()) for i in range(len(train))] == [m.text for m, _ in masked]
    assert [tgt.decode(train.pair(i)[1].tolist()) for i in range(0, len(train), 7)] == [t for _, t in masked[::7]]
    valid = ParallelSplit.open(run, "valid", cfg)
    valid_zh, valid_en = lines(run / "corpus/valid.zh"), lines(run / "corpus/valid.en")
    pairs = [
        mask_pair(normalize_source(z, cfg.data), normalize_target(e, cfg.data), Detector.from_data(cfg.data))
        for z, e in zip(valid_zh, valid_en, strict=True)
    ]  # valid pairs are normalised as translation will see them, and masked as train is
    assert [src.decode(valid.pair(i)[0].tolist()) for i in range(0, len(valid), 5)] == [m.text for m, _ in pairs[::5]]
    assert valid.src_lengths.tolist()[:50] == [len(src.encode(m.text)) for m, _ in pairs[:50]]
    assert valid.tgt_lengths.tolist()[:50] == [len(tgt.encode(t)) for _, t in pairs[:50]]


def test_second_build_is_skipped(real_run):
    cfg, run, report = real_run
    stamp = run / "vocab.stamp.json"
    before = (
        stamp.stat().st_mtime_ns,
        (run / "vocab/zh.model").stat().st_mtime_ns,
        (run / "bin/train/manifest.json").stat().st_mtime_ns,
    )
    assert build_vocab(cfg, run) == json.loads(json.dumps(report))
    after = (
        stamp.stat().st_mtime_ns,
        (run / "vocab/zh.model").stat().st_mtime_ns,
        (run / "bin/train/manifest.json").stat().st_mtime_ns,
    )
    assert after == before


def test_changed_vocab_config_redoes_models_and_encoding(real_run, tmp_path):
    cfg, _, _ = real_run
    run = copy_run(tmp_path, real_run, with_vocab=True)
    old = ParallelSplit.open(run, "train", cfg).tgt_ids
    bigger = config({"tgt_size": 800})
    assert build_vocab(bigger, run)["en"]["vocab_size"] == 800
    assert load_tokenizers(run, bigger)[1].vocab_size == 800
    new = ParallelSplit.open(run, "train", bigger)
    assert len(new.tgt_ids) < len(old)  # more pieces, shorter encoding: not the stale arrays
    assert int(new.tgt_ids.max()) >= 600


def test_placeholders_are_whole_pieces_of_both_models(real_run):
    cfg, run, report = real_run
    src, tgt = load_tokenizers(run, cfg)
    assert src.has_pieces(PLACEHOLDERS) and tgt.has_pieces(PLACEHOLDERS)
    assert PLACEHOLDERS[3] in [src.piece(i) for i in src.encode(f"我爱{PLACEHOLDERS[3]}。")]
    assert PLACEHOLDERS[9] in [tgt.piece(i) for i in tgt.encode(f"I love{PLACEHOLDERS[9]}s.")]
    assert report["passthrough"]["train"]["pairs"] == 1500  # masked pairs: tests/test_passthrough.py


def test_turning_passthrough_off_redoes_vocab_without_placeholders(real_run, tmp_path):
    run = copy_run(tmp_path, real_run, with_vocab=True)
    stamp = (run / "vocab.stamp.json").read_text()
    off = config(passthrough=[])
    report = build_vocab(off, run)
    assert (run / "vocab.stamp.json").read_text() != stamp and "passthrough" not in report
    src, tgt = load_tokenizers(run, off)
    assert not src.has_pieces(PLACEHOLDERS[:1]) and not tgt.has_pieces(PLACEHOLDERS[:1])
    train = ParallelSplit.open(run, "train", off)
    assert [src.decode(train.pair(i)[0].tolist()) for i in range(len(train))] == lines(run / "corpus/train.zh")
    build_vocab(config(passthrough=["number"]), run)  # another set of kinds: another stamp
    assert load_tokenizers(run, off)[0].has_pieces(PLACEHOLDERS)


def test_changed_corpus_redoes_vocab(real_run, tmp_path):
    cfg, _, _ = real_run
    run = copy_run(tmp_path, real_run, with_vocab=True)
    stamp = (run / "vocab.stamp.json").read_text()
    with open(run / "corpus/valid.en", "a", encoding="utf-8") as f:
        f.write("An extra line.\n")
    with open(run / "corpus/valid.zh", "a", encoding="utf-8") as f:
        f.write("多一行。\n")
    build_vocab(cfg, run)
    assert (run / "vocab.stamp.json").read_text() != stamp
    assert len(ParallelSplit.open(run, "valid", cfg)) == len(lines(run / "corpus/valid.zh"))


def test_bpe_is_selectable(real_run, tmp_path):
    run = copy_run(tmp_path, real_run)
    cfg = config({"type": "bpe", "src_size": 1000, "tgt_size": 500, "workers": 1})
    report = build_vocab(cfg, run)
    scores = [float(line.split("\t")[1]) for line in lines(run / "vocab/en.vocab")]
    assert all(s == int(s) for s in scores)  # BPE scores are merge ranks; unigram ones log-probabilities
    unigram_scores = [float(line.split("\t")[1]) for line in lines(real_run[1] / "vocab/en.vocab")]
    assert any(s != int(s) for s in unigram_scores)
    assert report["zh"]["valid_unk_rate"] == 0.0 and report["en"]["vocab_size"] == 500


def test_too_small_vocab_keeps_only_frequent_chars_with_byte_fallback(real_run, tmp_path):
    run = copy_run(tmp_path, real_run)
    cfg = config({"src_size": 400, "tgt_size": 200})
    with warns(r"vocab\.src_size=400: \d+ of \d+ characters fit"):
        report = build_vocab(cfg, run)
    assert report["zh"]["vocab_size"] == 400 and report["zh"]["chars_limited"]
    assert report["zh"]["valid_unk_rate"] == 0.0


def test_byte_fallback_en_spells_letters_the_english_pieces_lack(real_run, tmp_path):
    """Off (the default) the English model has no byte pieces and writes "ç" as <unk>; with
    vocab.byte_fallback_en it spells it as its two UTF-8 bytes, and decodes back to it."""
    cfg, run, _ = real_run
    plain = load_tokenizers(run, cfg)[1].sp
    assert not any(plain.is_byte(i) for i in range(plain.get_piece_size()))
    assert UNK_ID in plain.encode("Timuçin") and plain.piece_to_id("ç") == UNK_ID
    run = copy_run(tmp_path, real_run)
    on = config({"byte_fallback_en": True})
    report = build_vocab(on, run)
    assert report["en"]["byte_fallback"] and report["en"]["vocab_size"] == 600
    bytes_ = load_tokenizers(run, on)[1].sp
    ids = bytes_.encode("Timuçin")
    assert UNK_ID not in ids and bytes_.decode(ids) == "Timuçin"
    assert [bytes_.id_to_piece(i) for i in ids if bytes_.is_byte(i)] == ["<0xC3>", "<0xA7>"]


def test_split_digits_gives_every_digit_its_own_piece_on_both_sides(real_run, tmp_path):
    """Off, the models hold pieces of several digits; with vocab.split_digits none, and a number
    encodes one digit a piece (the English side may prefix the first with "▁")."""
    cfg, run, _ = real_run

    def multi_digit(sp) -> list[str]:
        pieces = (sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_byte(i))
        return [p for p in pieces if sum(c.isdigit() for c in p) > 1]

    assert any(multi_digit(tok.sp) for tok in load_tokenizers(run, cfg))
    run = copy_run(tmp_path, real_run)
    on = config({"split_digits": True})
    build_vocab(on, run)
    src, tgt = (tok.sp for tok in load_tokenizers(run, on))
    assert not multi_digit(src) and not multi_digit(tgt)
    for sp, text in ((src, "他1955年100岁。"), (tgt, "In 1955 he was 100.")):
        pieces = [sp.decode([i]).strip() for i in sp.encode(text)]  # a byte piece as its character
        assert [p for p in pieces if any(c.isdigit() for c in p)] == list("1955100")


def lacking(sp, chars: str) -> str:
    """The characters of `chars` that `sp` has no piece for (read as <unk> or as bytes)."""
    return "".join(c for c in chars if sp.piece_to_id(c) == UNK_ID or sp.is_byte(sp.piece_to_id(c)))


def test_ascii_pieces_make_every_ascii_character_a_piece_of_both_sides(real_run, tmp_path):
    """Off, the Chinese model lacks ASCII letters its sample holds too rarely (a raw name is read
    partly as byte pieces) and the English one lacks punctuation its sample never held (<unk>);
    with vocab.ascii_pieces each of the 94 characters is a piece of both, and a raw name and URL
    encode without a byte piece or <unk> and decode back."""
    cfg, run, _ = real_run

    assert all(lacking(tok.sp, ASCII_CHARS) for tok in load_tokenizers(run, cfg))
    run = copy_run(tmp_path, real_run)
    on = config({"ascii_pieces": True})
    report = build_vocab(on, run)
    assert report["zh"]["vocab_size"] == 1200 and report["en"]["vocab_size"] == 600
    for tok in load_tokenizers(run, on):
        assert lacking(tok.sp, ASCII_CHARS) == ""
        text = "Wiqyzk: https://x.org/a_b?q=1&r=~2 @jo #7"
        ids = tok.sp.encode(text)
        assert UNK_ID not in ids and not any(tok.sp.is_byte(i) for i in ids)
        assert tok.sp.decode(ids) == text


def test_accented_pieces_make_accented_letters_pieces_of_both_sides(real_run, tmp_path):
    """Off, the models lack most accented letters; with vocab.accented_pieces each of them, lower
    and upper case, is a piece of both models (not bytes, not <unk>), and accented names encode
    and decode back; the English model has no byte fallback still."""
    cfg, run, _ = real_run

    assert all(len(lacking(tok.sp, ACCENTED_CHARS)) > 40 for tok in load_tokenizers(run, cfg))
    assert set(ACCENTED_LETTERS) < set(ACCENTED_CHARS) and "Ł" in ACCENTED_CHARS
    run = copy_run(tmp_path, real_run)
    on = config({"accented_pieces": True})
    build_vocab(on, run)
    for tok in load_tokenizers(run, on):
        assert lacking(tok.sp, ACCENTED_CHARS) == ""
        for name in ("Timuçin", "Wienczysława", "Yaguatí", "Łódź", "Émile"):
            ids = tok.sp.encode(name)
            assert UNK_ID not in ids and tok.sp.decode(ids) == name
    assert not any(tok.sp.is_byte(i) for i in range(tok.sp.get_piece_size()))  # the English side


def test_vocab_too_small_without_byte_fallback_names_the_key(real_run, tmp_path):
    run = copy_run(tmp_path, real_run)
    with pytest.raises(NmtError, match=r"vocab\.tgt_size=40 is too small for .*train\.en.*use vocab\.tgt_size >= \d+"):
        build_vocab(config({"tgt_size": 40}), run)
    assert not (run / "vocab.stamp.json").exists()


def test_vocab_larger_than_corpus_supports_is_trained_smaller(tmp_path):
    run = tmp_path / "run"
    (run / "corpus").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (run / f"corpus/{split}.zh").write_text("我爱你。\n你好。\n" * 5, encoding="utf-8")
        (run / f"corpus/{split}.en").write_text("I love you.\nHello.\n" * 5, encoding="utf-8")
    cfg = config({"src_size": 500, "tgt_size": 300, "workers": 1})
    with warns(r"vocab\.tgt_size=300 is more than .*train\.en supports"):
        report = build_vocab(cfg, run)
    assert report["en"]["vocab_size"] < 300 and report["en"]["requested_size"] == 300


def test_missing_corpus_and_models_raise(tmp_path):
    with pytest.raises(NmtError, match=r"corpus/train\.zh: not found; run `nmt download`"):
        build_vocab(config(), tmp_path)
    with pytest.raises(NmtError, match=r"vocab/zh\.model: SentencePiece model not found"):
        load_tokenizers(tmp_path, config())
    with pytest.raises(NmtError, match="not found"):
        Tokenizer(tmp_path / "x.model")


# --------------------------------------------------------------------------- deterministic, bounded vocabularies

VOCAB_FILES = ("zh.model", "en.model", "zh.vocab", "en.vocab", "sample.zh", "sample.en")


def vocab_bytes(run: Path) -> dict[str, bytes]:
    return {name: (run / "vocab" / name).read_bytes() for name in VOCAB_FILES}


def spec_strings(message) -> list[str]:
    """Every string held by a protobuf message (repeated fields included)."""
    out: list[str] = []
    for fd, value in message.ListFields():
        if fd.type == fd.TYPE_STRING:
            out += list(value) if isinstance(value, Iterable) and not isinstance(value, str) else [value]
    return out


def test_models_hold_no_path_of_the_machine(real_run):
    """SentencePiece stores its settings in the model: none may be a path (of the run, of /tmp)."""
    from sentencepiece import sentencepiece_model_pb2

    cfg, run, report = real_run
    for lang in ("zh", "en"):
        raw = (run / "vocab" / f"{lang}.model").read_bytes()
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(raw)
        spec = proto.trainer_spec
        assert list(spec.input) == [] and spec.model_prefix == "" and spec.input_sentence_size == 0
        assert spec.num_threads == report[lang]["threads"] == 1
        strings = spec_strings(spec) + spec_strings(proto.normalizer_spec)
        assert strings and not [s for s in strings if "/" in s or tempfile.gettempdir() in s]
        assert str(run).encode() not in raw and str(run.parent).encode() not in raw


def test_models_are_byte_identical_across_run_directories_workers_and_pair_order(real_run, tmp_path):
    """1 or 2 workers, another run directory, the train pairs in another order: the same bytes."""
    reference = vocab_bytes(real_run[1])  # workers 2
    for name, workers, shuffled in (("one", 1, False), ("two", 2, False), ("shuffled", 2, True)):
        run = tmp_path / name
        shutil.copytree(real_run[1] / "corpus", run / "corpus")
        if shuffled:
            pairs = list(zip(lines(run / "corpus/train.zh"), lines(run / "corpus/train.en"), strict=True))
            random.Random(5).shuffle(pairs)
            for i, lang in enumerate(("zh", "en")):
                (run / f"corpus/train.{lang}").write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")
        build_vocab(config({"workers": workers}), run)
        assert vocab_bytes(run) == reference, name


def test_sample_is_bounded_by_vocab_sample_chars(real_run, tmp_path):
    run = copy_run(tmp_path, real_run)
    cfg = config({"sample_chars": 3000, "src_size": 700, "tgt_size": 300})
    report = build_vocab(cfg, run)
    longest = max(map(len, lines(run / "corpus/train.zh")))
    for lang in ("zh", "en"):
        sample = report[lang]["sample"]
        text = lines(run / "vocab" / f"sample.{lang}")
        assert 3000 <= sample["chars"] == sum(map(len, text)) < 3000 + max(longest, 300)
        assert sample["sentences"] == len(text) < sample["of_sentences"] == 1500
    assert report["zh"]["sample"]["sentences"] > report["en"]["sample"]["sentences"]  # zh lines are shorter
    capped = build_vocab(config({"sample_chars": 3000, "max_sentences": 40, "src_size": 700, "tgt_size": 300}), run)
    assert capped["zh"]["sample"]["sentences"] == capped["en"]["sample"]["sentences"] == 40


def dying_side(real_train_model, kill: bool):
    """`train_model` whose target side leaves a half-written model and then dies (SIGKILL) or raises."""

    def train_model(config, sample, model, side, text=None):
        if side == "src":
            return real_train_model(config, sample, model, side, text)
        (model.parent / f".{model.name}.halfwritten.tmp").write_bytes(b"\x0a\x02")
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("interrupted")

    return train_model


@pytest.mark.parametrize(("workers", "kill"), [(1, True), (2, True), (2, False)])
def test_an_interrupted_build_then_a_rerun_ends_with_the_same_bytes(real_run, tmp_path, monkeypatch, workers, kill):
    """The target side dies half-way (its process killed, or an exception); the rerun removes
    what was half-written and ends with the bytes of an uninterrupted build."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("the failing side is patched in; only forked workers see the patch")
    monkeypatch.setattr(vocab_module, "START_METHOD", "fork")
    run = copy_run(tmp_path, real_run)
    cfg = config({"workers": workers})
    monkeypatch.setattr(vocab_module, "train_model", dying_side(vocab_module.train_model, kill))
    with pytest.raises(NmtError if kill else RuntimeError, match="died" if kill else "interrupted"):
        build_vocab(cfg, run)
    assert not (run / "vocab.stamp.json").exists() and list((run / "vocab").glob(".*.tmp"))
    monkeypatch.undo()
    build_vocab(cfg, run)
    assert vocab_bytes(run) == vocab_bytes(real_run[1]) and not list((run / "vocab").glob(".*.tmp"))


def test_sample_chars_must_be_positive():
    with pytest.raises(ConfigError, match=r"vocab\.sample_chars"):
        config({"sample_chars": 0})

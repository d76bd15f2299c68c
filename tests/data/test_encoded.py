"""nmt.data.encoded: token shards with a lengths index and a manifest (encode_split, write_split),
ParallelSplit reading a pair at a time, and a one-line error for a split an older nmt encoded."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm

from nmt.config import config_from_dict
from nmt.data import encoded
from nmt.data.encoded import ParallelSplit, TextSide, encode_split, shard_of, token_dtype, write_split
from nmt.errors import NmtError

ROOT = Path(__file__).resolve().parents[2]
EN = [f"sentence number {i} has {'many ' * (i % 4)}words" for i in range(23)]
ZH = [f"第{i}个句子{'很长' * (i % 3)}。" for i in range(23)]
CONFIG = config_from_dict({"name": "t"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    out = {}
    for lang, text in (("zh", ZH), ("en", EN)):
        (root / f"{lang}.txt").write_text("\n".join(text * 4) + "\n", encoding="utf-8")
        options = {"vocab_size": 300 if lang == "zh" else 60, "byte_fallback": lang == "zh", "hard_vocab_limit": False}
        spm.SentencePieceTrainer.train(
            input=str(root / f"{lang}.txt"), model_prefix=str(root / lang), pad_id=0, unk_id=1, bos_id=2, eos_id=3,
            minloglevel=2, **options,
        )  # fmt: skip
        out[lang] = root / f"{lang}.model"
    return out


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sides(run, models, split="train", zh=ZH, en=EN):
    return [
        TextSide("zh", write(run / "corpus" / f"{split}.zh", zh), models["zh"]),
        TextSide("en", write(run / "corpus" / f"{split}.en", en), models["en"]),
    ]


def make_split(run, models, split="train", zh=ZH, en=EN, **kw):
    kw.setdefault("shard_pairs", None)
    return encode_split(run / "bin", split, sides(run, models, split, zh, en), seed=1, **kw)


def folder_bytes(folder: Path) -> dict[str, str]:
    """sha256 of every file in a folder, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def corpus_order(n: int, seed: int, shards: int) -> np.ndarray:
    """Corpus line of each pair of the split, shards in order (pairs keep corpus order in a shard)."""
    shard = shard_of(np.arange(n), seed, shards)
    return np.concatenate([np.flatnonzero(shard == k) for k in range(shards)])


def test_shards_hold_every_pair_with_lengths_and_a_manifest(tmp_path, models):
    many_zh, many_en = ZH * 5, EN * 5  # 115 pairs in shards of up to 40: 3 shards
    info = make_split(tmp_path, models, zh=many_zh, en=many_en, shard_pairs=40, chunk_lines=7)
    manifest = json.loads((tmp_path / "bin/train/manifest.json").read_text())
    assert manifest["pairs"] == 115 and len(manifest["shards"]) == 3
    assert manifest["token_dtype"] == {"zh": "<u2", "en": "<u2"}
    for shard in manifest["shards"]:
        for name, meta in shard["files"].items():
            data = (tmp_path / "bin/train" / name).read_bytes()
            assert meta == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    sp = {lang: spm.SentencePieceProcessor(model_file=str(m)) for lang, m in models.items()}
    ds = ParallelSplit.open(tmp_path, "train", CONFIG)
    order = corpus_order(115, seed=1, shards=3)
    assert len(ds) == 115 and sorted(order.tolist()) == list(range(115))
    for i, line in enumerate(order):
        src, tgt = ds.pair(i)
        assert src.dtype == np.uint16 and sp["zh"].decode(src.tolist()) == many_zh[line]
        assert sp["en"].decode(tgt.tolist()) == many_en[line]
    assert ds.src_lengths.tolist() == [len(sp["zh"].encode(many_zh[line])) for line in order]
    tokens = sum(len(sp["en"].encode(e)) for e in many_en)
    assert info["en"] == {"sentences": 115, "tokens": tokens, "unk": 0}


def test_every_shard_mixes_the_sources(tmp_path):
    """Pairs of two sources, one after the other in the corpus, spread over all shards."""
    n, shards = 4000, 4
    first = np.arange(n) < n // 2  # the first source's pairs
    shard = shard_of(np.arange(n), 7, shards)
    for k in range(shards):
        in_shard = shard == k
        assert 0.4 < first[in_shard].mean() < 0.6 and 0.2 < in_shard.mean() < 0.3
    assert not np.array_equal(shard, shard_of(np.arange(n), 8, shards))  # the seed matters


def test_bytes_are_the_same_for_1_or_2_workers_and_any_run_directory(tmp_path, models):
    zh, en = ZH * 6, EN * 6
    make_split(tmp_path / "a", models, zh=zh, en=en, shard_pairs=50, workers=1, chunk_lines=100)
    make_split(tmp_path / "elsewhere" / "b", models, zh=zh, en=en, shard_pairs=50, workers=2, chunk_lines=4)
    a, b = folder_bytes(tmp_path / "a/bin/train"), folder_bytes(tmp_path / "elsewhere/b/bin/train")
    assert a == b and len(a) == 3 * 4 + 1  # 3 shards x (tok, len) x 2 languages + the manifest


KILLED = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_encoded import TextSide
from nmt.data.encoded import encode_split
seen = []

def progress(n):
    seen.append(n)
    if len(seen) == 3:  # the third chunk: files half written
        os.kill(os.getpid(), signal.SIGKILL)

sides = [TextSide("zh", Path({zh!r}), Path({zh_model!r})), TextSide("en", Path({en!r}), Path({en_model!r}))]
encode_split(Path({bin!r}), "train", sides, seed=1, shard_pairs=40, chunk_lines=5, on_progress=progress)
"""


def test_a_kill_during_encoding_then_a_rerun_ends_with_the_same_bytes(tmp_path, models):
    zh, en = ZH * 4, EN * 4
    make_split(tmp_path / "clean", models, zh=zh, en=en, shard_pairs=40)
    run = tmp_path / "killed"
    texts = sides(run, models, zh=zh, en=en)
    script = tmp_path / "kill.py"
    script.write_text(KILLED.format(
        tests=str(Path(__file__).parent), zh=str(texts[0].text), en=str(texts[1].text),
        zh_model=str(models["zh"]), en_model=str(models["en"]), bin=str(run / "bin"),
    ))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (run / "bin/train").exists() and any(p.name.startswith(".train.tmp-") for p in (run / "bin").iterdir())
    with pytest.raises(NmtError, match="manifest.json: not found"):
        ParallelSplit.open(run, "train", CONFIG)  # a killed encoding leaves no split to train on
    encode_split(run / "bin", "train", texts, seed=1, shard_pairs=40)
    assert folder_bytes(run / "bin/train") == folder_bytes(tmp_path / "clean/bin/train")
    assert sorted(p.name for p in (run / "bin").iterdir()) == ["train"]  # the scratch folder is gone


def test_encoding_runs_one_sentencepiece_thread_per_worker(tmp_path, models, monkeypatch):
    calls = []
    encode = spm.SentencePieceProcessor.encode

    def spy(self, lines, **kw):
        calls.append(kw.get("num_threads"))
        return encode(self, lines, **kw)

    monkeypatch.setattr(spm.SentencePieceProcessor, "encode", spy)
    make_split(tmp_path, models, chunk_lines=10)
    assert calls and set(calls) == {1}


class _LowerTarget:
    """A chunk preparation (`nmt.data.encoded.PairPrep`): targets lower-cased."""

    def lines(self, src: list[str], tgt: list[str]) -> tuple[list[str], list[str], int]:
        return src, [t.lower() for t in tgt], sum(t != t.lower() for t in tgt)


@pytest.mark.parametrize("workers", [1, 2])
def test_pairs_are_prepared_before_encoding_in_the_workers(tmp_path, models, workers):
    texts = sides(tmp_path, models, zh=["第1个句子。", "第2个句子。"], en=["SENTENCE NUMBER 1", "sentence number 2"])
    counts = encode_split(tmp_path / "bin", "valid", texts, 1, None, workers, chunk_lines=1, prepare=_LowerTarget())
    sp = spm.SentencePieceProcessor(model_file=str(models["en"]))
    split = ParallelSplit.open(tmp_path, "valid", CONFIG)
    assert [split.pair(i)[1].tolist() for i in range(2)] == sp.encode(["sentence number 1", "sentence number 2"])
    assert counts["changed_pairs"] == 1


def test_a_vocabulary_over_65535_pieces_is_stored_as_uint32(tmp_path):
    assert token_dtype(65_535) == np.dtype("<u2") and token_dtype(65_536) == np.dtype("<u4")
    ids = np.array([5, 70_000, 65_535, 9], dtype=np.int64)
    sides = {"zh": [(ids, np.array([2, 2]))], "en": [(ids[:3], np.array([1, 2]))]}
    manifest = write_split(tmp_path / "bin", "train", sides, {"zh": 80_000, "en": 66_000})
    assert manifest["token_dtype"] == {"zh": "<u4", "en": "<u4"}
    ds = ParallelSplit.open(tmp_path, "train", CONFIG)
    assert [ds.pair(1)[0].tolist(), ds.pair(1)[1].tolist()] == [[65_535, 9], [70_000, 65_535]]


def test_empty_split_opens(tmp_path, models):
    make_split(tmp_path, models, "test", zh=[], en=[])
    ds = ParallelSplit.open(tmp_path, "test", CONFIG)
    assert len(ds) == 0 and ds.src_lengths.shape == (0,)
    with pytest.raises(IndexError):
        ds.pair(0)


def test_mismatched_line_counts_raise(tmp_path, models):
    with pytest.raises(NmtError, match=rf"train\.zh has {len(ZH)} lines but .*train\.en has {len(ZH) - 1}"):
        make_split(tmp_path, models, zh=ZH, en=EN[:-1])
    assert not (tmp_path / "bin/train").exists()


def test_missing_or_damaged_shards_raise_one_line_errors(tmp_path, models):
    with pytest.raises(NmtError, match=r"bin/valid/manifest\.json: not found; run `nmt vocab`"):
        ParallelSplit.open(tmp_path, "valid", CONFIG)
    make_split(tmp_path, models)
    tok = tmp_path / "bin/train/s0000.en.tok"
    tok.write_bytes(tok.read_bytes()[:-2])
    with pytest.raises(NmtError, match=r"s0000\.en\.tok: \d+ bytes, the manifest says \d+; rerun `nmt vocab`"):
        ParallelSplit.open(tmp_path, "train", CONFIG)
    tok.unlink()
    with pytest.raises(NmtError, match=r"s0000\.en\.tok: missing"):
        ParallelSplit.open(tmp_path, "train", CONFIG)
    (tmp_path / "bin/train/manifest.json").write_text("{not json")
    with pytest.raises(NmtError, match=r"manifest\.json: unreadable"):
        ParallelSplit.open(tmp_path, "train", CONFIG)
    make_split(tmp_path, models)
    french = SimpleNamespace(data=SimpleNamespace(src_lang="zh", tgt_lang="fr"))
    with pytest.raises(NmtError, match=r"manifest\.json: has no fr side \(it has \['zh', 'en'\]\)"):
        ParallelSplit.open(tmp_path, "train", french)


def write_older_layout(run, split, pairs):
    """A split as an older nmt encoded it: <run>/bin/{split}.{lang}.npy int32 ids + .offsets.npy int64."""
    out = run / "bin"
    out.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("zh", "en")):
        seqs = [np.asarray(p[side], dtype=np.int32) for p in pairs]
        offsets = np.concatenate(([0], np.cumsum([len(s) for s in seqs]))).astype(np.int64)
        np.save(out / f"{split}.{lang}.npy", np.concatenate(seqs).astype(np.int32))
        np.save(out / f"{split}.{lang}.offsets.npy", offsets)


def test_a_split_in_the_older_layout_raises_one_line_saying_to_rerun_vocab(tmp_path, models):
    write_older_layout(tmp_path, "train", [([5, 6, 7], [8]), ([9], [10, 11])])
    with pytest.raises(NmtError) as raised:
        ParallelSplit.open(tmp_path, "train", CONFIG)
    assert str(raised.value) == (
        f"{tmp_path / 'bin'}: encoded with an older nmt layout (train.zh.npy); rerun `nmt vocab --run {tmp_path}`"
    )
    assert encoded.encoded_files(tmp_path, "train") == []  # nothing a stage stamp could hash
    make_split(tmp_path, models)  # a new encoding: read, whatever older files lie beside it
    assert (tmp_path / "bin/train.zh.npy").is_file()
    assert len(ParallelSplit.open(tmp_path, "train", CONFIG)) == len(ZH)
    assert encoded.encoded_files(tmp_path, "train") == [tmp_path / "bin/train/manifest.json"]


def test_pairs_are_read_from_the_files_not_mapped(tmp_path, models):
    """Reading tokens does not map the token files (their pages would count as the trainer's memory)."""
    make_split(tmp_path, models, zh=ZH * 3, en=EN * 3, shard_pairs=20)
    ds = ParallelSplit.open(tmp_path, "train", CONFIG)
    for i in range(len(ds)):
        ds.pair(i)
    maps = Path(f"/proc/{os.getpid()}/maps")
    if maps.is_file():
        assert ".tok" not in maps.read_text()
    assert len(ds._open) <= encoded._OPEN_WINDOWS  # older shards closed

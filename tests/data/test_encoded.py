"""nmt.data.encoded: binarize to int32 ids + int64 offsets, and the memory-mapped ParallelSplit."""

from __future__ import annotations

import numpy as np
import pytest
import sentencepiece as spm

from nmt.config import config_from_dict
from nmt.data.encoded import ParallelSplit, binarize
from nmt.errors import NmtError

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
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def make_split(run, models, split="train", zh=ZH, en=EN, **kw):
    (run / "corpus").mkdir(parents=True, exist_ok=True)
    for lang, lines in (("zh", zh), ("en", en)):
        text = write(run / "corpus" / f"{split}.{lang}", lines)
        binarize(text, models[lang], run / "bin" / f"{split}.{lang}", **kw)


def test_binarize_writes_ids_and_offsets_that_decode_back(tmp_path, models):
    text = write(tmp_path / "train.en", EN)
    info = binarize(text, models["en"], tmp_path / "bin" / "train.en", chunk_lines=5)
    ids, off = np.load(tmp_path / "bin/train.en.npy"), np.load(tmp_path / "bin/train.en.offsets.npy")
    assert ids.dtype == np.int32 and off.dtype == np.int64 and off.shape == (len(EN) + 1,) and off[0] == 0
    sp = spm.SentencePieceProcessor(model_file=str(models["en"]))
    assert [sp.decode(ids[off[i] : off[i + 1]].tolist()) for i in range(len(EN))] == EN
    assert info == {"sentences": len(EN), "tokens": len(ids), "unk": int((ids == 1).sum())}
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["train.en.npy", "train.en.offsets.npy"]


def test_workers_and_chunks_do_not_change_the_result(tmp_path, models):
    text = write(tmp_path / "t.zh", ZH)
    binarize(text, models["zh"], tmp_path / "a", workers=1, chunk_lines=100)
    binarize(text, models["zh"], tmp_path / "b", workers=2, chunk_lines=4)
    for suffix in (".npy", ".offsets.npy"):
        assert np.array_equal(np.load(f"{tmp_path}/a{suffix}"), np.load(f"{tmp_path}/b{suffix}"))


def test_normalize_is_applied_before_encoding(tmp_path, models):
    text = write(tmp_path / "t.en", ["SENTENCE NUMBER 1"])
    binarize(text, models["en"], tmp_path / "n", normalize=str.lower)
    sp = spm.SentencePieceProcessor(model_file=str(models["en"]))
    assert np.load(tmp_path / "n.npy").tolist() == sp.encode("sentence number 1")


def test_parallel_split_is_memory_mapped_with_lengths_and_pairs(tmp_path, models):
    make_split(tmp_path, models)
    ds = ParallelSplit.open(tmp_path, "train", CONFIG)
    sp_zh = spm.SentencePieceProcessor(model_file=str(models["zh"]))
    sp_en = spm.SentencePieceProcessor(model_file=str(models["en"]))
    assert len(ds) == len(ZH) and isinstance(ds.src_ids, np.memmap)
    assert ds.src_lengths.tolist() == [len(sp_zh.encode(z)) for z in ZH]
    assert ds.tgt_lengths.tolist() == [len(sp_en.encode(e)) for e in EN]
    src, tgt = ds.pair(7)
    assert sp_zh.decode(src.tolist()) == ZH[7] and sp_en.decode(tgt.tolist()) == EN[7]
    assert sp_en.decode(ds.pair(-1)[1].tolist()) == EN[-1]
    with pytest.raises(IndexError):
        ds.pair(len(ZH))


def test_empty_split_opens(tmp_path, models):
    make_split(tmp_path, models, "test", zh=[], en=[])
    ds = ParallelSplit.open(tmp_path, "test", CONFIG)
    assert len(ds) == 0 and ds.src_lengths.shape == (0,)


def test_mismatched_counts_raise(tmp_path, models):
    make_split(tmp_path, models, zh=ZH, en=EN[:-1])
    with pytest.raises(NmtError, match=rf"train\.zh\.npy has {len(ZH)} sentences but train\.en\.npy has {len(ZH) - 1}"):
        ParallelSplit.open(tmp_path, "train", CONFIG)


def test_missing_or_inconsistent_arrays_raise(tmp_path, models):
    with pytest.raises(NmtError, match=r"bin/valid\.zh\.npy: not found; run `nmt vocab`"):
        ParallelSplit.open(tmp_path, "valid", CONFIG)
    make_split(tmp_path, models)
    np.save(tmp_path / "bin/train.en.offsets.npy", np.array([0, 5, 10**6], dtype=np.int64))
    with pytest.raises(NmtError, match=r"train\.en\.offsets\.npy: offsets do not match"):
        ParallelSplit.open(tmp_path, "train", CONFIG)

"""A run's SentencePiece models as tokenizers (nmt/data/tokenizer.py): the pieces two vocabularies share."""

from __future__ import annotations

import sentencepiece as spm

from nmt.data.tokenizer import Tokenizer, shared_pieces


def test_shared_pieces_spell_the_same_text_on_both_sides(spm_models):
    src, tgt = Tokenizer(spm_models[0]), Tokenizer(spm_models[1])
    pairs = shared_pieces(src, tgt)
    assert pairs.shape[1] == 2 and len(pairs) > 20
    assert len(set(pairs[:, 0].tolist())) == len(pairs)  # a source piece reads one target row
    for i, j in pairs.tolist():
        assert src.decode([i]) == tgt.decode([j]) or src.piece(i) == tgt.piece(j)
    assert (src.sp.piece_to_id("⦅0⦆"), tgt.sp.piece_to_id("⦅0⦆")) in set(map(tuple, pairs.tolist()))
    assert not set(pairs[:, 0].tolist()) & {0, 1, 2, 3}  # pad, unk, bos, eos: never shared


def test_an_ascii_byte_piece_shares_the_row_of_its_character(spm_models):
    """The Chinese vocabulary holds rare Latin letters as bytes ("<0x75>" for "u"): that byte reads
    the English "u"."""
    src, tgt = Tokenizer(spm_models[0]), Tokenizer(spm_models[1])
    pairs = dict(map(tuple, shared_pieces(src, tgt).tolist()))
    checked = 0
    for char in "abcdefghijklmnopqrstuvwxyz0123456789":
        byte, letter = src.sp.piece_to_id(f"<0x{ord(char):02X}>"), tgt.sp.piece_to_id(char)
        if letter != tgt.sp.unk_id():
            assert pairs[byte] == letter, char
            checked += 1
    assert checked > 10


def test_a_character_the_target_holds_as_a_byte_shares_that_byte(tmp_path, spm_models):
    """The other direction (en→zh): a letter of the English source reads the Chinese side's byte."""
    (tmp_path / "t.txt").write_text("中文句子。\n" * 50 + "另一个句子。\n" * 50, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "zh"), vocab_size=300, byte_fallback=True,
        hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
    )  # fmt: skip
    en, zh = Tokenizer(spm_models[1]), Tokenizer(tmp_path / "zh.model")
    pairs = dict(map(tuple, shared_pieces(en, zh).tolist()))
    q = en.sp.piece_to_id("e")
    assert zh.sp.piece_to_id("e") == zh.sp.unk_id() and pairs[q] == zh.sp.piece_to_id("<0x65>")


def test_copyable_pieces_are_single_letters_digits_and_placeholders(spm_models):
    from nmt.data.tokenizer import copyable_pieces

    src, tgt = Tokenizer(spm_models[0]), Tokenizer(spm_models[1])
    shared, copyable = shared_pieces(src, tgt), copyable_pieces(src, tgt)
    assert set(map(tuple, copyable.tolist())) < set(map(tuple, shared.tolist()))
    texts = {tgt.decode([j]) for j in copyable[:, 1]}  # a byte piece as its character
    assert {"⦅0⦆", "⦅1⦆"} <= texts and not {".", ",", "▁"} & texts
    assert all(t in ("⦅0⦆", "⦅1⦆") or (len(t) == 1 and t.isascii() and t.isalnum()) for t in texts)

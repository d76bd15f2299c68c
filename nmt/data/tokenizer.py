"""A run's SentencePiece models as tokenizers, loaded without the vocabulary-training machinery
(so that translating starts fast); `nmt.data.vocab` trains them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt import UNK_ID
from nmt.config import Config
from nmt.data.passthrough import PLACEHOLDERS
from nmt.errors import NmtError
from nmt.run.layout import RunDir


class Tokenizer:
    """One SentencePiece model. Ids exclude BOS/EOS; callers add and strip them."""

    def __init__(self, model_path: Path) -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise NmtError(f"{self.path}: SentencePiece model not found; run `nmt vocab` first")
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.vocab_size: int = self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def has_pieces(self, pieces: Iterable[str]) -> bool:
        """Whether every piece is a whole symbol of this model (e.g. the pass-through placeholders)."""
        return all(self.sp.piece_to_id(p) != UNK_ID for p in pieces)


def load_tokenizers(run_dir: Path, config: Config) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers of a run."""
    run = RunDir(run_dir)
    return Tokenizer(run.vocab_model(config.data.src_lang)), Tokenizer(run.vocab_model(config.data.tgt_lang))


_PRINTABLE_ASCII = range(0x21, 0x7F)  # the characters a byte piece and a letter piece may both spell


def shared_pieces(src: Tokenizer, tgt: Tokenizer) -> np.ndarray:
    """(K, 2) int64: (source id, target id) of every piece the two vocabularies spell alike: the
    same piece ("K", "▁M", "⦅0⦆"), or an ASCII character one side holds as a piece and the other as
    its byte ("u" and "<0x75>"). Control pieces and <unk> are never shared; used by
    ``train.share_piece_embeddings`` (nmt/model/shared_rows.py)."""
    pairs = []
    for i in range(src.vocab_size):
        if src.sp.is_control(i) or src.sp.is_unknown(i):
            continue
        j = _same_piece(tgt.sp, _as_text(src.sp, i))
        if j is not None:
            pairs.append((i, j))
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def _as_text(sp: spm.SentencePieceProcessor, i: int) -> str:
    """Piece i, with a byte piece of a printable ASCII character as that character."""
    piece = sp.id_to_piece(i)
    if sp.is_byte(i) and (byte := int(piece[3:5], 16)) in _PRINTABLE_ASCII:
        return chr(byte)
    return piece


def _same_piece(sp: spm.SentencePieceProcessor, text: str) -> int | None:
    """The id `sp` gives `text` as one piece, or as its byte piece (one ASCII character); None."""
    j = sp.piece_to_id(text)
    if j != sp.unk_id() and not sp.is_control(j):
        return j
    if len(text) == 1 and ord(text) in _PRINTABLE_ASCII:
        j = sp.piece_to_id(f"<0x{ord(text):02X}>")
        return j if j != sp.unk_id() and sp.is_byte(j) else None
    return None


def copyable_pieces(src: Tokenizer, tgt: Tokenizer) -> np.ndarray:
    """(K, 2) int64: the rows of `shared_pieces` a copy writes one to one: a single ASCII letter or
    digit (as a piece or its byte piece on either side) and the pass-through placeholders. A copy
    example's target spells its made-up span one such piece per character
    (`nmt.batches.copy_spans.spell_spans`), in step with the source's; ``train.guided_alignment``
    (nmt/train/alignment.py) aligns those pieces."""
    pairs = shared_pieces(src, tgt)
    keep = [i for i, (s, _) in enumerate(pairs) if _copyable(_as_text(src.sp, int(s)))]
    return pairs[keep].reshape(-1, 2)


def _copyable(text: str) -> bool:
    return (len(text) == 1 and text.isascii() and text.isalnum()) or text in PLACEHOLDERS

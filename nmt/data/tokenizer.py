"""A run's SentencePiece models as tokenizers, loaded without the vocabulary-training machinery
(so that translating starts fast); `nmt.data.vocab` trains them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from nmt import UNK_ID
from nmt.config import Config
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

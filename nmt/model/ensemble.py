"""Several models decoded as one: at every step their log-probabilities are averaged.

`Ensemble` keeps the decoding protocol (`nmt.contracts.DecodingModel`), so greedy, beam and
sampling search drive it unchanged: each member encodes the source and keeps its own KV cache,
`reorder` moves every member's cache the same way, and `decode_step` returns the mean of the
members' log-softmax outputs (a product of experts, renormalised by the search). The members
must share their vocabularies (`check_vocabularies`); their shapes may differ. Averaging the
log-probabilities of a model with itself returns that model's own log-probabilities bit for
bit (x + x = 2x and halving are exact), so an ensemble of one model twice decodes exactly as
the model alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from nmt.errors import NmtError


class EnsembleState:
    """The members' decoding states, moved together."""

    def __init__(self, states: list) -> None:
        self.states = states

    def reorder(self, index: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        for state in self.states:
            state.reorder(index, sentences=sentences, beam=beam)


class Ensemble(nn.Module):
    """`models` (at least one) decoded as one model."""

    decodes_log_probs = True  # decode_step returns log-probabilities: the search uses them as they are

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(models)
        self.steppers: list[Any] = list(models)  # whose decode_step runs: the members, or their FastDecoders
        self.cfg = models[0].cfg  # the first member's shape: what a precision probe is sized by
        self.max_positions = min(m.max_positions for m in models)

    def split_projections(self) -> None:
        """Each member's projections as separate linear layers (packing and int8 reach them)."""
        for member in self.members:
            member.split_projections()

    def encode(self, src: Tensor) -> list[Tensor]:
        """Each member's encoder output for `src` (B, S), by length groups where it can."""
        return [getattr(m, "encode_by_length", m.encode)(src) for m in self.members]

    def start_decoding(self, enc: list[Tensor]) -> EnsembleState:
        return EnsembleState([m.start_decoding(e) for m, e in zip(self.members, enc, strict=True)])

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        """tokens (R,) → (R, V) the members' mean log-probabilities (fp32)."""
        total = None
        for member, member_state in zip(self.steppers, state.states, strict=True):
            lp = torch.log_softmax(member.decode_step(tokens, member_state).float(), dim=-1)  # (R, V)
            total = lp if total is None else total + lp
        return total / len(self.members)


def check_vocabularies(vocabs: Sequence[tuple[Path, Path]]) -> None:
    """NmtError (one line) unless every member's (source, target) SentencePiece models are the
    same files, byte for byte, as the first member's."""
    first = [_digest(p) for p in vocabs[0]]
    for pair in vocabs[1:]:
        for side, path, want in zip(("source", "target"), pair, first, strict=True):
            if _digest(path) != want:
                raise NmtError(
                    f"--checkpoint: {path} is not the {side} vocabulary of the first model ({vocabs[0][0].parent}); "
                    "ensemble members must share their vocabularies"
                )


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise NmtError(f"{path}: cannot read the vocabulary ({e.strerror or e})") from None

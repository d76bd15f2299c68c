"""Guided alignment (``train.guided_alignment``): one cross-attention head taught to look at the
source piece a copy is writing.

Why: a model trained with copy examples (`nmt.batches.copy_spans`) copies names and numbers one
character at a time, and what it still loses on the raw path (exported runtimes, no pass-through
masks) is where it lost its place: runs of equal characters ("400" → "4000", "2005" → "205"),
spans run together or left out in long sentences. Supervising one attention head with alignments
(Garg et al., 2019, "Jointly Learning to Align and Translate with Transformer Models", EMNLP;
Marian's ``--guided-alignment``, which production systems rely on to carry tags and placeholders
over) gives the decoder a pointer to the next source character. Only training changes: the head is
an ordinary head, so decoding, every export and every runtime run the model as before.

Where the alignments come from: none are given, and none are needed. A copy example's target
spells its made-up span one piece per character, in step with the source's single-character
pieces, and a masked span is one placeholder on each side; so the targets are read off each batch
(`alignment_targets`): every run of consecutive target pieces a copy writes one to one
(`nmt.data.tokenizer.copyable_pieces`: ASCII letters, digits, placeholders) is aligned, piece for
piece, to a place in the source that holds the same run (the first after the previous run's place,
else the first). A run the source does not hold, or a lone letter (the "n" of "wasn't"), gets none.

The loss (`guided_loss`): −log of the head's attention on the aligned source piece, summed over
the aligned target positions; and at the position after each copied run, −log(1 − the attention on
that run), so that the head moves on once the run is written (a head left on the last "0" of "400"
reads as one more "0" to write). × ``train.guided_alignment``, added to the label-smoothed loss sum
of the batch (both are divided by the update's target tokens). The head is head 0 of the last
decoder layer (Marian's default layer for it), whose output the prediction reads most directly.
Under ``train.compile`` the hook is untested (compilation is off on CPUs, where this was measured).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from nmt import PAD_ID
from nmt.data.tokenizer import Tokenizer, copyable_pieces
from nmt.errors import NmtError

HEAD = 0  # the supervised head of the last decoder layer's cross-attention
COPY, LEAVE_FROM, LEAVE_TO = 0, 1, 2  # the columns of `alignment_targets`

# (V_s,), (V_t,) int64: a piece's character key, -1 = not copyable; the keys of the letters
Keys = tuple[np.ndarray, np.ndarray, frozenset[int]]


def copy_keys(src: Tokenizer, tgt: Tokenizer) -> Keys:
    """Per vocabulary, each piece's key (the target id of the character or placeholder it spells,
    so that a source byte piece and its letter share one) or -1 where a copy never writes it."""
    src_keys = np.full(src.vocab_size, -1, dtype=np.int64)
    tgt_keys = np.full(tgt.vocab_size, -1, dtype=np.int64)
    pairs = copyable_pieces(src, tgt)
    for s, t in pairs:
        src_keys[s] = tgt_keys[t] = t
    letters = frozenset(int(t) for t in pairs[:, 1] if tgt.decode([int(t)]).isalpha())  # a byte piece as its letter
    return src_keys, tgt_keys, letters


def alignment_targets(src: np.ndarray, tgt_out: np.ndarray, keys: Keys) -> np.ndarray:
    """src (B, S) and tgt_out (B, T) ids (padded; the source with its EOS) → (B, T, 3) int64 per
    target position: [COPY] the source position it copies; [LEAVE_FROM, LEAVE_TO) the source run a
    copy has just finished, at the position after the copied run (which must look elsewhere); -1 for
    none (see the module docstring)."""
    src_keys, tgt_keys = keys[0][src], keys[1][tgt_out]  # (B, S), (B, T)
    letters = keys[2]
    out = np.full((*tgt_out.shape, 3), -1, dtype=np.int64)
    for b in np.flatnonzero((tgt_keys >= 0).any(axis=1)):
        start = 0
        for run in _runs(np.flatnonzero(tgt_keys[b] >= 0)):
            if run.size == 1 and int(tgt_keys[b, run[0]]) in letters:
                continue  # a lone letter is a word's end ("wasn" "'" "t"), not a copy (names have two or more)
            at = _find(src_keys[b], tgt_keys[b, run], start)
            if at is None:
                continue
            out[b, run, COPY] = at + np.arange(run.size)
            start = at + run.size
            after = run[-1] + 1
            if after < tgt_out.shape[1] and tgt_out[b, after] != PAD_ID and tgt_keys[b, after] < 0:
                out[b, after, LEAVE_FROM], out[b, after, LEAVE_TO] = at, start
    return out


def _runs(positions: np.ndarray) -> list[np.ndarray]:
    """Sorted positions split into runs of consecutive ones: [3, 4, 5, 9] → [3, 4, 5], [9]."""
    return np.split(positions, np.flatnonzero(np.diff(positions) != 1) + 1)


def _find(row: np.ndarray, run: np.ndarray, start: int) -> int | None:
    """Where `run` stands in `row` as consecutive entries: the first place at or after `start`,
    else the first; None where it stands nowhere."""
    if run.size > row.size:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(row, run.size)  # (S - n + 1, n)
    hits = np.flatnonzero((windows == run).all(axis=1))
    if hits.size == 0:
        return None
    later = hits[hits >= start]
    return int(later[0] if later.size else hits[0])


class GuidedAlignment:
    """The guided-alignment loss of `model` (a Transformer: ``decoder.layers[-1].cross_attn``),
    recorded by a forward hook on that module while training.

    `targets(*batch)` reads a batch's targets on the host; `expect` arms the hook with them for the
    next forward passes; `take` returns the loss those passes recorded (their mean: R-Drop runs
    two; unweighted: the trainer applies the weight) and disarms it. In evaluation mode, or unarmed, the hook
    does nothing.
    """

    def __init__(self, model: nn.Module, keys: Keys) -> None:
        layers = getattr(getattr(model, "decoder", None), "layers", None)
        if not layers or not hasattr(layers[-1], "cross_attn"):
            raise NmtError("train.guided_alignment: needs a Transformer (a decoder with cross-attention)")
        self.module, self.keys = layers[-1].cross_attn, keys
        self._armed: tuple[Tensor, Tensor] | None = None  # (rows (R,), targets (R, T, 3)) on the device
        self._losses: list[Tensor] = []
        self.module.register_forward_hook(self._record, with_kwargs=True)

    def targets(self, src: Tensor, _tgt_in: Tensor, tgt_out: Tensor) -> np.ndarray:
        """(B, T, 3) int64 `alignment_targets` of a batch's ids (read on the host): `targets(*batch)`."""
        return alignment_targets(src.cpu().numpy(), tgt_out.cpu().numpy(), self.keys)

    @staticmethod
    def copied(targets: np.ndarray) -> int:
        """How many target pieces of a batch's `targets` copy a source piece."""
        return int((targets[..., COPY] >= 0).sum())

    def expect(self, targets: np.ndarray, device: torch.device) -> None:
        """Arm the hook with a batch's targets (only its rows with one are computed)."""
        rows = np.flatnonzero((targets[..., COPY] >= 0).any(axis=1))
        self._armed = None
        if rows.size:
            self._armed = (torch.from_numpy(rows).to(device), torch.from_numpy(targets[rows]).to(device))

    def take(self) -> Tensor | None:
        """The recorded loss (mean over the passes since `expect`), None if none; disarms."""
        losses, self._losses, self._armed = self._losses, [], None
        return torch.stack(losses).mean() if losses else None

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, _out: Any) -> None:
        if self._armed is None or not module.training:
            return
        rows, target = self._armed  # (R,), (R, T, 3)
        memory = args[1] if len(args) > 1 else kwargs["memory"]  # (B, S, D)
        scores = module.head_scores(args[0].index_select(0, rows), memory.index_select(0, rows), HEAD)  # (R, T, S)
        pad = kwargs.get("key_pad")
        if pad is not None:
            scores = scores.masked_fill(pad.index_select(0, rows)[:, None, :], float("-inf"))
        self._losses.append(guided_loss(scores.log_softmax(dim=-1), target))  # fp32 scores: `head_scores`


def guided_loss(log_probs: Tensor, target: Tensor) -> Tensor:
    """log_probs (R, T, S) of the head, target (R, T, 3) (`alignment_targets`) → the summed
    −log attention on each copied piece plus −log(1 − attention on the run) after each run.

    Computed in fp32 whatever `log_probs` is: in bf16 an attention of 1 − 1e-6 on the run rounds
    to 1 and its −log(1 − p) to infinity (under autocast, CUDA's or DDP's, updates were skipped as
    non-finite until training stopped)."""
    log_probs = log_probs.float()
    copy = target[..., COPY]  # (R, T)
    picked = log_probs.gather(2, copy.clamp(min=0)[..., None]).squeeze(2)  # (R, T)
    loss = -torch.where(copy >= 0, picked, torch.zeros_like(picked)).sum()
    source = torch.arange(log_probs.size(2), device=log_probs.device)  # (S,)
    inside = (source >= target[..., LEAVE_FROM, None]) & (source < target[..., LEAVE_TO, None])  # (R, T, S)
    on_run = torch.where(inside, log_probs.exp(), torch.zeros_like(log_probs)).sum(-1)  # (R, T); 0 where none
    return loss - torch.log1p(-on_run.clamp(max=1 - 1e-6)).sum()

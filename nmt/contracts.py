"""The contracts between the parts, as `typing.Protocol`s: what a search needs of a model, what
training asks a model whether it can do, what the `Translator` needs of an engine and a tokenizer.

`nmt.model.transformer.Transformer` is the model, `nmt.decode.engines.NativeEngine` and
`nmt.decode.ct2.CTranslate2Engine` are the engines, `nmt.data.tokenizer.Tokenizer` is the tokenizer;
tests drive the searches with small stand-ins that keep the same contracts (a model whose
output is its input, a model that counts its calls). Nothing here is imported at run time by
those classes: a protocol is satisfied by shape, not by inheritance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

Pairs = list[tuple[list[int], float]]  # one sentence's hypotheses: (target ids without BOS/EOS, score), best first
Found = list[Pairs]  # per sentence of a batch
OnDone = Callable[[int, Pairs], None] | None  # called once per sentence as soon as it is done


class DecodingState(Protocol):
    """The per-batch state of incremental decoding (`nmt.model.kv_cache.DecoderState`)."""

    def reorder(self, index: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        """Row r becomes old row index[r], in place; `beam=K`: B rows → B*K; `sentences`: keep only
        those sentences (beams)."""
        ...


@runtime_checkable
class DecodingModel(Protocol):
    """What greedy and beam search drive (`nmt.decode.search`):

    enc = model.encode(src)                 # src (B, S): ids + [EOS], right-padded with PAD
    state = model.start_decoding(enc)       # cross-attention K/V once; one row per sentence
    logits = model.decode_step(tok, state)  # tok (R,) → (R, V) fp32 logits; appends to the cache
    """

    def encode(self, src: Tensor) -> Tensor: ...

    def start_decoding(self, enc: Tensor) -> DecodingState: ...

    def decode_step(self, tokens: Tensor, state: DecodingState) -> Tensor: ...


@runtime_checkable
class PacksLogits(Protocol):
    """A model whose `forward(src, tgt_in, keep)` returns logits only at the target positions
    `keep` (B, T) marks, `(N, V)` instead of `(B, T, V)`: training and validation then compute
    the loss on real tokens alone. A capability, asked with `isinstance`, not a class check."""

    packs_logits: bool


@runtime_checkable
class SplitsProjection(Protocol):
    """A model that `PacksLogits` and whose `forward(src, tgt_in, keep, project=False)` returns the
    decoder's output at those positions, (N, D), before the output projection `output_weight`
    (V, D): training then projects and computes the loss a chunk of rows at a time, without the
    (N, V) logits (`nmt.train.objective.projected_label_smoothed_nll`)."""

    output_weight: Tensor


class Engine(Protocol):
    """A decoding engine behind the `Translator` (native PyTorch, CTranslate2)."""

    name: str
    precision: str  # the precision it resolved to (fp32 | bf16 | fp16 | int8)

    def search(
        self,
        seqs: list[list[int]],
        beam: int,
        nbest: int,
        len_penalty: float,
        greedy: bool,
        on_done: OnDone = None,
        *,
        sampling: Any = None,
    ) -> Found:
        """`seqs`: source piece ids without EOS; per sequence up to `nbest` hypotheses, best first
        (score NaN for greedy and for sampling, `nmt.decode.options.Sampling`, which replaces
        the search)."""
        ...


class TokenizerLike(Protocol):
    """One side's SentencePiece model (`nmt.data.tokenizer.Tokenizer`)."""

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...

    def piece(self, i: int) -> str: ...

"""Source embedding rows taken from the target table while training (``train.share_piece_embeddings``).

Why: nmt's two vocabularies are separate, so the letter "K" of a Chinese source and the letter
"K" the decoder writes are two unrelated rows, and a model must learn from its copy examples alone
that one stands for the other (`nmt.batches.copy_spans`); it copies names and numbers letter by
letter, and slips on runs of equal letters ("2005" → "205", "Ann" → "Annn"). With the row shared,
the encoder's input for "K" is the decoder's output row for "K" (the tied projection): copying it
is what the vectors already say.

How: `share_rows` swaps ``model.src_embed`` for a `SharedRowsEmbedding` holding the same weight
Parameter (the same state-dict key), whose lookup reads each shared row from the target table, so
that its gradient goes there; `SharedRowsEmbedding.sync`, run after every optimizer step, copies
those rows into the source table. Every checkpoint, moving average, averaged model and export
therefore holds a whole, ordinary source table, and a model trained this way decodes and exports
as any other. Which pieces are shared (`nmt.data.tokenizer.shared_pieces`) depends on the two
vocabularies only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SharedRowsEmbedding(nn.Embedding):
    """`own`'s table, except rows `pairs[:, 0]`, read from `other`'s rows `pairs[:, 1]`.

    Args:
        own: the source embedding (V_s, D); its weight Parameter is kept, not copied.
        other: the target embedding (V_t, D), not a submodule here (its weight has one home).
        pairs: (K, 2) int64, (source id, target id) per shared piece; source ids distinct.
    """

    def __init__(self, own: nn.Embedding, other: nn.Embedding, pairs: Tensor) -> None:
        super().__init__(own.num_embeddings, own.embedding_dim, padding_idx=own.padding_idx, device="meta")
        self.weight = own.weight
        self._other = (other,)  # a tuple, so that nn.Module does not register it
        device = own.weight.device
        self.register_buffer("src_rows", pairs[:, 0].to(device=device, dtype=torch.long), persistent=False)
        self.register_buffer("tgt_rows", pairs[:, 1].to(device=device, dtype=torch.long), persistent=False)

    def table(self) -> Tensor:
        """(V_s, D) the table a lookup reads: shared rows from the target table (gradient there)."""
        return self.weight.index_put((self.src_rows,), self._other[0].weight[self.tgt_rows])

    def forward(self, ids: Tensor) -> Tensor:
        """(B, L) ids → (B, L, D)."""
        return F.embedding(ids, self.table(), self.padding_idx)

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the shared rows into the source table (after each optimizer step)."""
        self.weight[self.src_rows] = self._other[0].weight[self.tgt_rows]


def share_rows(model: nn.Module, pairs: Tensor) -> SharedRowsEmbedding:
    """Swap `model.src_embed` for a `SharedRowsEmbedding` over `model.tgt_embed` and sync it once
    (so that the source table is whole from the start); returns it, for `sync` after each step."""
    shared = SharedRowsEmbedding(model.src_embed, model.tgt_embed, pairs)
    shared.sync()
    model.src_embed = shared
    return shared

"""Regularisers applied inside a training update (never at validation or decoding time).

- Source word dropout (``train.src_word_dropout``): each real source piece is replaced by
  ``<unk>`` with probability p (Sennrich & Zhang, 2019, "Revisiting Low-Resource Neural Machine
  Translation", dropped words among their low-resource settings; Gal & Ghahramani, 2016, drop
  whole word embeddings). Replaced, not deleted: the batch keeps its shape, its padding and its
  host-computed packing, and the model learns one "unknown piece" embedding that it also meets
  for a real out-of-vocabulary piece. Padding, EOS and the other special ids (< 4) are never
  touched; a back-translation tag is an ordinary piece and may be replaced like any other.
  The mask is drawn from torch's generator on the batch's device, whose state every checkpoint
  saves, so a resumed run drops the same pieces.
- R-Drop (``train.rdrop_alpha``; Liang et al., "R-Drop: Regularized Dropout for Neural
  Networks", NeurIPS 2021): two forward passes of the same batch under different dropout masks,
  and α times the symmetric KL divergence between their output distributions added to the
  mean of their two cross-entropies (`symmetric_kl`). Needs dropout to do anything; costs a
  second forward and backward per micro-batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nmt import PAD_ID, UNK_ID

SPECIAL_IDS = 4  # PAD, UNK, BOS, EOS: ids below this are never dropped


def drop_source_words(src: torch.Tensor, p: float) -> torch.Tensor:
    """`src` (B, S) int64 with each piece of id >= 4 replaced by UNK_ID with probability `p`
    (a new tensor; `src` is not changed). p = 0 returns `src` itself."""
    if p <= 0:
        return src
    droppable = src >= SPECIAL_IDS  # excludes PAD_ID, UNK_ID, BOS_ID, EOS_ID
    hit = torch.rand(src.shape, device=src.device) < p
    return torch.where(droppable & hit, torch.full_like(src, UNK_ID), src)


def symmetric_kl(a: torch.Tensor, b: torch.Tensor, target: torch.Tensor, packed: bool) -> torch.Tensor:
    """Σ over non-pad target positions of ½ (KL(p_a ‖ p_b) + KL(p_b ‖ p_a)), in fp32.

    a, b: logits of two passes, (B, T, V) with `target` (B, T) (pad positions left out), or packed
    (N, V) with `packed=True` (every row real). Per row, ½ Σ_v (p_a - p_b)(log p_a - log p_b),
    which is the symmetric KL; both passes get its gradient (R-Drop's objective)."""
    a, b = a.float().flatten(0, -2), b.float().flatten(0, -2)  # (N, V)
    if not packed:
        keep = target.reshape(-1) != PAD_ID
        a, b = a[keep], b[keep]
    la, lb = F.log_softmax(a, dim=-1), F.log_softmax(b, dim=-1)
    return 0.5 * ((la.exp() - lb.exp()) * (la - lb)).sum()

"""A uniform k-subset of the cleaned pairs (`data.max_train_pairs`, and the real:synthetic cap of
`nmt.data.synthetic_filter`): exactly k of them, in their order, seeded, without holding pairs in
memory. Not the vocabulary's sample of lines (`nmt.data.vocab_sample`).

How many pairs each unit gives is one multivariate hypergeometric draw over the units' pair
counts (k balls from urns of those sizes, numpy's `Generator(seed)`); which pairs of unit u is
a draw of that many positions without replacement by `Generator((seed, u))`. Together: every
k-subset equally likely. It depends on the input, the settings and the seed only (units are
fixed by the input, `nmt.data.units`), not on the number of workers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def subset_masks(sizes: Sequence[int], k: int, seed: int) -> list[np.ndarray]:
    """Per unit, a bool mask over its `sizes[u]` pairs, True for the chosen; k in all (all pairs
    when there are no more than k)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.sum() <= k:
        return [np.ones(n, dtype=bool) for n in sizes]
    counts = np.random.default_rng(seed).multivariate_hypergeometric(sizes, k, method="marginals")
    masks = []
    for u, (n, c) in enumerate(zip(sizes, counts, strict=True)):
        mask = np.zeros(n, dtype=bool)
        mask[np.random.default_rng((seed, u)).choice(n, size=c, replace=False)] = True
        masks.append(mask)
    return masks


def keep_subset(masks: Sequence[np.ndarray], k: int, seed: int) -> tuple[list[np.ndarray], int]:
    """`masks` (per unit, the pairs still in) with only k of their True values left True, drawn
    as `subset_masks` draws (all of them when there are no more than k); and how many it dropped."""
    chosen = subset_masks([int(m.sum()) for m in masks], k, seed)
    out = []
    for m, c in zip(masks, chosen, strict=True):
        mask = m.copy()
        mask[m] = c
        out.append(mask)
    return out, sum(int(m.sum()) for m in masks) - sum(int(m.sum()) for m in out)

"""Random sampling instead of search: top-k, nucleus (top-p) and temperature, seeded.

`nmt translate --sample-topk K --sample-topp P --temperature T --seed N` decodes each sentence by
drawing every next token from the model's distribution, restricted to the K most probable
tokens (0 = all) and to the smallest set of most probable tokens whose probability reaches P
(Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration"), after dividing the
logits by T. Back-translation uses it to make more varied synthetic sources than beam search
(Edunov et al., 2018, "Understanding Back-Translation at Scale").

Reproducible and batch-invariant: the uniform number behind a sentence's draw at step t is a
hash of (seed, the sentence's source ids, t), computed on the tensors (`uniforms`), not taken
from a generator whose state depends on what else is in the batch; the token is then read off
the sorted distribution's cumulative sum (inverse-CDF). The same seed gives the same output for
a sentence whichever sentences share its batch, and `topk=1` is exactly greedy search.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from nmt import PAD_ID
from nmt.decode.options import Sampling

_MASK = 0xFFFFFFFF
_MIX = 0x45D9F3B  # a 32-bit multiplicative hash constant: products stay below 2**59 in int64
_GOLDEN = 0x9E3779B1


def sentence_keys(src: Tensor) -> Tensor:
    """(B,) int64: a 32-bit hash of each row's source ids (PAD ignored), the sentence's identity."""
    rows = src.tolist()
    keys = [zlib.crc32(",".join(str(t) for t in row if t != PAD_ID).encode()) for row in rows]
    return torch.tensor(keys, dtype=torch.long, device=src.device)


def _hash32(x: Tensor) -> Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32)."""
    x = ((x ^ (x >> 16)) * _MIX) & _MASK
    x = ((x ^ (x >> 16)) * _MIX) & _MASK
    return x ^ (x >> 16)


def uniforms(seed: int, keys: Tensor, step: int) -> Tensor:
    """(R,) float64 in [0, 1): the draw of each sentence `keys` (R,) at decoding `step`."""
    salt = _hash32(torch.tensor((seed * _GOLDEN + step) & _MASK, dtype=torch.long))
    return _hash32(_hash32(keys ^ salt) ^ (step & _MASK)).double() / 2.0**32


def sample_tokens(logits: Tensor, sampling: Sampling, keys: Tensor, step: int) -> Tensor:
    """(R,) next tokens drawn from `logits` (R, V) (-inf where a token is forbidden) for the
    sentences `keys` (R,) at `step`."""
    scores, order = torch.sort(logits.float() / sampling.temperature, dim=-1, descending=True, stable=True)
    if 0 < sampling.topk < scores.size(-1):
        scores[:, sampling.topk :] = float("-inf")
    probs = torch.softmax(scores, dim=-1)  # (R, V), sorted descending
    if sampling.topp < 1.0:
        before = probs.cumsum(dim=-1) - probs  # mass of the more probable tokens
        probs = probs.masked_fill(before >= sampling.topp, 0.0)  # the first token always stays
    cdf = probs.double().cumsum(dim=-1)  # (R, V)
    u = uniforms(sampling.seed, keys, step).to(cdf.device).unsqueeze(1) * cdf[:, -1:]  # (R, 1)
    choice = (cdf <= u).sum(dim=-1).clamp_(max=scores.size(-1) - 1)  # (R,): first index whose cdf > u
    return order.gather(1, choice.unsqueeze(1)).squeeze(1)

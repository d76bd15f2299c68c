"""Cross-attention maps: where the decoder looked in the source while writing each target piece.

The chosen translation is teacher-forced through the model once (`[BOS] + target` in, like
training). A forward hook on every decoder cross-attention module records its inputs (the
normalised decoder states and the encoder memory); Q and K are recomputed from those by the
module's own projection layers (so plain, pre-packed, bf16 and int8 models all work) and the
attention probabilities as softmax(Q K^T / sqrt(d_k)) in fp32, with the source padding
masked. The model's code is not touched, so the map is what the model computes whatever
attention backend (math, sdpa, flash) it runs.

Row t of a map is the attention while predicting target piece t (the last row predicts EOS);
column s is source piece s (the last column is the source EOS). Maps are averaged over the
heads and then over the layers unless `layer` picks one.

A translator on CTranslate2 holds no PyTorch model; its map is read from the native model of
the checkpoint it was exported from (loaded once, fp32 on the CPU: a single teacher-forced pass),
so the heatmap shows the weights that decoded the translation.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from nmt import BOS_ID, PAD_ID
from nmt.batches.batching import pad_sources
from nmt.data.passthrough import CLOSE, OPEN, Masked
from nmt.errors import NmtError


@dataclass
class AttentionMap:
    """One sentence pair's cross-attention: `weights[t][s]`, rows sum to 1."""

    source: list[str]  # source pieces + "</s>"
    target: list[str]  # target pieces + "</s>"
    weights: list[list[float]]  # (len(target), len(source))

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "weights": self.weights}


def cross_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The decoder's cross-attention modules, in layer order: modules whose name ends in a
    `cross`-something part and that hold a projection `in_proj` and a head count `heads`."""
    found = [
        m
        for name, m in model.named_modules()
        if "cross" in name.rsplit(".", 1)[-1] and hasattr(m, "in_proj") and hasattr(m, "heads")
    ]
    if not found:
        raise NmtError(
            f"{type(model).__name__}: no decoder cross-attention module found (looked for submodules named "
            "'*cross*' with `in_proj` and `heads`); nmt/serve/attention_map.py must follow the model's layout"
        )
    return found


def _queries_and_keys(module: nn.Module, x: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
    """Q (B, T, D) and K (B, S, D) through the module's own projection layers, whatever they are
    (`nn.Linear`, pre-packed, int8-quantised, bf16): `q_proj` and `kv_proj` (rows [W_k; W_v]) where
    the model split them, else the fused `in_proj` (rows [W_q; W_k; W_v])."""
    D = memory.size(-1)
    q_proj, kv_proj = getattr(module, "q_proj", None), getattr(module, "kv_proj", None)
    if q_proj is not None and kv_proj is not None:
        return q_proj(x), kv_proj(memory)[..., :D]
    return module.in_proj(x)[..., :D], module.in_proj(memory)[..., D : 2 * D]


def attention_probs(module: nn.Module, x: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
    """Cross-attention probabilities of `module`. x (B, T, D) decoder states entering it, memory
    (B, S, D), src_pad (B, S) True = padding → (B, H, T, S) in fp32, zero at padded keys."""
    D, H = memory.size(-1), int(module.heads)
    dk = D // H
    q, k = (t.float() for t in _queries_and_keys(module, x, memory))
    q = q.view(*q.shape[:2], H, dk).transpose(1, 2)  # (B, H, T, dk)
    k = k.view(*k.shape[:2], H, dk).transpose(1, 2)  # (B, H, S, dk)
    scores = q @ k.transpose(-2, -1) / math.sqrt(dk)  # (B, H, T, S)
    scores = scores.masked_fill(src_pad[:, None, None, :], float("-inf"))
    return scores.softmax(dim=-1)


def _memory_argument(args: tuple, kwargs: dict) -> Tensor:
    if len(args) > 1 and isinstance(args[1], Tensor):
        return args[1]
    memory = kwargs.get("memory")
    if not isinstance(memory, Tensor):
        raise NmtError("cross-attention hook: the module was called without an encoder memory argument")
    return memory


def cross_attention(model: nn.Module, src: list[list[int]], tgt: list[list[int]]) -> Tensor:
    """Teacher-forced cross-attention of a batch. src/tgt: piece ids without BOS/EOS →
    (L, B, H, T, S) fp32 with T = longest target + 1 (EOS), S = longest source + 1 (EOS);
    rows of padded target positions are meaningless, columns of padded sources are 0."""
    modules = cross_attention_modules(model)
    src_t = pad_sources(src).to(_device(model))  # (B, S)
    width = max(len(t) for t in tgt) + 1
    tgt_in = torch.full((len(tgt), width), PAD_ID, dtype=torch.long)  # (B, T): BOS + target
    for row, ids in enumerate(tgt):
        tgt_in[row, : len(ids) + 1] = torch.tensor([BOS_ID, *ids])
    src_pad = src_t == PAD_ID
    seen: list[Tensor | None] = [None] * len(modules)

    def hook(i: int):
        def record(module: nn.Module, args: tuple, kwargs: dict, _out: Any) -> None:
            seen[i] = attention_probs(module, args[0], _memory_argument(args, kwargs), src_pad)

        return record

    handles = [m.register_forward_hook(hook(i), with_kwargs=True) for i, m in enumerate(modules)]
    try:
        with torch.inference_mode():
            model(src_t, tgt_in.to(src_t.device))
    finally:
        for h in handles:
            h.remove()
    if any(p is None for p in seen):
        raise NmtError("cross-attention hook: a decoder cross-attention module did not run in the teacher-forced pass")
    return torch.stack([p for p in seen if p is not None])  # (L, B, H, T, S)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def attention_map(translator: Any, source: str, target: str, layer: int | None = None) -> AttentionMap:
    """The map between `source` (Chinese text, normalised and tokenised as `Translator` does) and
    `target` (a translation, tokenised with the target model). `layer`: one decoder layer
    (negative counts from the end) instead of the mean over layers; NmtError for an empty source
    or a layer the decoder does not have."""
    model = reading_model(translator)
    src_ids = translator.encode_sources([source])[0]
    if not src_ids:
        raise NmtError("attention map: the source sentence is empty")
    tgt_ids = translator.tgt_tok.encode(target)
    probs = cross_attention(model, [src_ids], [tgt_ids])[:, 0].mean(dim=1)  # (L, T, S)
    if layer is not None and not -len(probs) <= layer < len(probs):
        raise NmtError(f"layer: {layer} is out of range ({-len(probs)}..{len(probs) - 1}, the decoder's layers)")
    grid = probs.mean(dim=0) if layer is None else probs[layer]  # (T, S)
    masked = translator.masks[0] if getattr(translator, "masks", None) else None
    return AttentionMap(
        source=[_label(translator.src_tok.piece(i), masked) for i in src_ids] + ["</s>"],
        target=[translator.tgt_tok.piece(i) for i in tgt_ids] + ["</s>"],
        weights=[[round(float(v), 5) for v in row] for row in grid.cpu()],
    )


_READERS: weakref.WeakKeyDictionary[Any, nn.Module] = weakref.WeakKeyDictionary()


def reading_model(translator: Any) -> nn.Module:
    """The PyTorch model whose attention `translator`'s maps show: its own (native engine), else
    the native model of its checkpoint file, loaded on first use and kept while the translator
    lives. NmtError where there is none (a translator built from an export directory alone)."""
    if translator.model is not None:
        return translator.model
    if translator not in _READERS:
        path = Path(translator.checkpoint) if translator.checkpoint is not None else None
        if path is None or not path.is_file():
            raise NmtError(
                f"attention maps need the model's checkpoint (this model runs on {translator.engine.name} "
                f"from {path}, which holds no PyTorch weights)"
            )
        from nmt.decode.loading import load_model

        sizes = (translator.src_tok.vocab_size, translator.tgt_tok.vocab_size)
        _READERS[translator] = load_model(translator.config, *sizes, path).eval()
    return _READERS[translator]


_PLACEHOLDER = re.compile(f"{OPEN}(\\d+){CLOSE}")


def _label(piece: str, masked: Masked | None) -> str:
    """A source piece as a person reads it: a pass-through placeholder (`⦅0⦆`, which the page's
    fonts cannot draw) shows the span it stands for ("iPhone"); other pieces as they are."""
    m = _PLACEHOLDER.search(piece)
    if masked is None or m is None or int(m.group(1)) >= len(masked.slots):
        return piece
    return piece[: m.start()] + masked.slots[int(m.group(1))] + piece[m.end() :]

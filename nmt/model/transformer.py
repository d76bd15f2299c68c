"""The encoder-decoder Transformer (Vaswani et al., 2017), built by plain composition.

Source and target have separate embeddings (scaled by sqrt(d_model)) plus sinusoidal or learned
positions; N encoder layers (self-attention, FFN) and N decoder layers (causal self-attention,
cross-attention, FFN), each sublayer wrapped in residual + dropout + LayerNorm, pre-norm (with a
final LayerNorm per stack) or post-norm. The output projection is the decoder embedding when
`tie_embeddings`. Incremental decoding keeps a per-layer K/V cache in `DecoderState`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt import PAD_ID
from nmt.config import Config, ModelConfig
from nmt.errors import NmtError
from nmt.model.attention import MultiHeadAttention, resolve_backend
from nmt.model.dropout import Dropout, dropout
from nmt.model.kv_cache import DecoderState, KVCache
from nmt.model.masks import Packing, cross_attention_bias, length_groups, padding_mask
from nmt.model.row_buckets import bucketed


@dataclass
class EncoderOut:
    memory: Tensor  # (B, S, D)
    src_pad: Tensor  # (B, S) bool, True = padding
    src_packing: Packing | None = None  # the same padding computed on the host (flash attention), if given


# --------------------------------------------------------------------------- building blocks


def _identity(x: Tensor) -> Tensor:
    return x


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """(P, D): sin(p / 10000^(2i/D)) at even dims 2i, cos at odd dims 2i+1 (Vaswani et al., 3.5)."""
    position = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class FeedForward(nn.Module):
    """fc2(drop(act(fc1(x)))): `activation_dropout` drops the (…, ffn_dim) activations, in training
    only (``model.activation_dropout``, apart from the residual ``model.dropout`` around the block)."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, activation_dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.act: Callable[[Tensor], Tensor] = F.relu if activation == "relu" else F.gelu
        self.activation_dropout = activation_dropout

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(bucketed(self.fc1, x))
        if self.training and self.activation_dropout > 0:
            h = dropout(h, self.activation_dropout)
        return bucketed(self.fc2, h)  # (B, T, D)


class Sublayer(nn.Module):
    """Residual + dropout + LayerNorm around one sublayer: pre-norm x + drop(f(LN(x))),
    post-norm LN(x + drop(f(x)))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        drop = self.dropout if self.training else _identity  # no module call per step when decoding
        if self.pre_norm:
            return x + drop(fn(self.norm(x)))
        return self.norm(x + drop(fn(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)
        self.attn_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, src_pad: Tensor, src_packing: Packing | None = None) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, key_pad=src_pad, key_packing=src_packing))  # (B, S, D)
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)
        self.self_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.cross_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, enc: EncoderOut, tgt_pad: Tensor, tgt_packing: Packing | None = None) -> Tensor:
        """x (B, T, D) → (B, T, D): causal self-attention over the target, cross-attention with the
        target as queries and the source (`enc`) as keys, FFN."""
        x = self.self_block(x, lambda h: self.self_attn(h, key_pad=tgt_pad, causal=True, key_packing=tgt_packing))
        cross = {"key_pad": enc.src_pad, "query_pad": tgt_pad}  # queries: the target; keys: the source
        cross |= {"key_packing": enc.src_packing, "query_packing": tgt_packing}
        x = self.cross_block(x, lambda h: self.cross_attn(h, enc.memory, **cross))
        return self.ffn_block(x, self.ffn)

    def step(self, x: Tensor, state: DecoderState, i: int) -> Tensor:
        """x (R, 1, D) → (R, 1, D); writes this token's self-attention K/V into layer i's cache.
        The reference step, written plainly; `nmt.model.fast_decoder` runs the same operations
        with the per-call overhead hoisted."""
        x = self.self_block(x, lambda h: self.self_attn.self_step(h, state.self_kv, i, state.step))
        x = self.cross_block(x, lambda h: self.cross_attn.cross_step(h, state, i))
        return self.ffn_block(x, self.ffn)


class Stack(nn.Module):
    """N layers plus the final LayerNorm of a pre-norm stack (identity for post-norm)."""

    def __init__(self, layers: list[nn.Module], d_model: int, pre_norm: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm: nn.Module = nn.LayerNorm(d_model) if pre_norm else nn.Identity()


# --------------------------------------------------------------------------- the model


class Transformer(nn.Module):
    """The encoder-decoder, built from `cfg` by plain composition; decodes through
    `nmt.contracts.DecodingModel` (encode, start_decoding, decode_step)."""

    packs_logits = True  # forward(src, tgt_in, keep) → logits at the `keep` positions (nmt.contracts)

    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int):
        super().__init__()
        self.cfg, self.src_vocab, self.tgt_vocab = cfg, src_vocab, tgt_vocab
        self.max_positions = cfg.max_positions
        D, pre = cfg.d_model, cfg.norm == "pre"
        self.embed_scale = math.sqrt(D)
        self.src_embed = nn.Embedding(src_vocab, D, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(tgt_vocab, D, padding_idx=PAD_ID)
        self.src_positions = nn.Embedding(cfg.max_positions, D) if cfg.positions == "learned" else None
        self.tgt_positions = nn.Embedding(cfg.max_positions, D) if cfg.positions == "learned" else None
        self.register_buffer("sinusoids", sinusoidal_table(cfg.max_positions, D), persistent=False)  # (P, D)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = Stack([EncoderLayer(cfg) for _ in range(cfg.encoder_layers)], D, pre)
        self.decoder = Stack([DecoderLayer(cfg) for _ in range(cfg.decoder_layers)], D, pre)
        self.output_proj = None if cfg.tie_embeddings else nn.Linear(D, tgt_vocab, bias=False)
        self.logits_proj: nn.Linear | None = None  # set by split_projections (inference only)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear layers (zero biases), normal(0, D^-0.5) embeddings, zero pad rows.
        A model built on the meta device (shapes only) is left uninitialised."""
        if self.src_embed.weight.is_meta:
            return
        std = self.cfg.d_model**-0.5
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.output_proj:
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.reset_parameters()  # Xavier per D×D slice of the fused projection
        for emb in (self.src_embed, self.tgt_embed, self.src_positions, self.tgt_positions, self.output_proj):
            if emb is not None:
                nn.init.normal_(emb.weight, mean=0.0, std=std)
        with torch.no_grad():
            self.src_embed.weight[PAD_ID].zero_()
            self.tgt_embed.weight[PAD_ID].zero_()

    # ----------------------------------------------------------------------- embeddings, logits

    def _embed(self, tokens: Tensor, table: nn.Embedding, positions: nn.Embedding | None, start: int = 0) -> Tensor:
        """(B, L) ids → (B, L, D) scaled token embedding + position (start, start+1, ...) + dropout."""
        L = tokens.size(1)
        if start + L > self.max_positions:
            raise NmtError(f"sequence of {start + L} tokens exceeds model.max_positions={self.max_positions}")
        x = table(tokens) * self.embed_scale  # (B, L, D)
        table_pos = self.sinusoids if positions is None else positions.weight  # (P, D)
        pos = table_pos[start : start + L].to(x.dtype)  # (L, D)
        x = x + pos[None]
        return self.dropout(x) if self.training else x

    @property
    def output_weight(self) -> Tensor:
        """The output projection (V, D): the decoder embedding when tied (`nmt.contracts.SplitsProjection`)."""
        return self.tgt_embed.weight if self.output_proj is None else self.output_proj.weight

    def _logits(self, h: Tensor) -> Tensor:
        """(B, T, D) decoder output → (B, T, V)."""
        if self.logits_proj is not None:
            return self.logits_proj(h)
        weight = self.output_weight
        return bucketed(lambda rows: F.linear(rows, weight), h)

    def split_projections(self) -> None:
        """Inference only: expose every matmul that runs through `F.linear` on a weight slice or a
        tied weight as an `nn.Linear` module sharing the same weights (cross-attention Q and K/V
        rows, the output projection), so that module-level conversions such as
        `nmt.model.convert.quantize_int8` reach them. The outputs do not change."""
        for layer in self.decoder.layers:
            layer.cross_attn.split_projections()
        weight = self.tgt_embed.weight if self.output_proj is None else self.output_proj.weight
        self.logits_proj = nn.Linear(weight.size(1), weight.size(0), bias=False, device=weight.device)
        self.logits_proj.weight = weight

    # ----------------------------------------------------------------------- training path

    def encode(self, src: Tensor, packing: Packing | None = None) -> EncoderOut:
        """src (B, S) ids with right padding → memory (B, S, D) and src_pad (B, S). `packing`: the
        source's `Packing` on src's device (the batch builder's), for the flash backend."""
        src_pad = padding_mask(src, PAD_ID)
        x = self._embed(src, self.src_embed, self.src_positions)  # (B, S, D)
        for layer in self.encoder.layers:
            x = layer(x, src_pad, packing)
        return EncoderOut(memory=self.encoder.norm(x), src_pad=src_pad, src_packing=packing)

    def encode_by_length(self, src: Tensor) -> EncoderOut:
        """`encode` for decoding a batch of mixed lengths (e.g. a server's batch in arrival order):
        rows run in groups of similar length (`nmt.model.masks.length_groups`), so that short sources
        do not pay for the longest one's padding. Real positions get what `encode` gives them; what
        `memory` holds at padding differs (the masks never read it). src (B, S) → memory (B, S, D),
        src_pad (B, S)."""
        lengths = (src != PAD_ID).sum(dim=1).tolist()  # (B,) real tokens, EOS included
        groups = length_groups(lengths)
        if len(groups) == 1:
            return self.encode(src)
        rows = [torch.tensor(group, device=src.device) for group in groups]
        widths = [lengths[group[0]] for group in groups]
        parts = [self.encode(src[r, :w]) for r, w in zip(rows, widths, strict=True)]  # (G, W, D) each
        memory = parts[0].memory.new_zeros(*src.shape, parts[0].memory.size(-1))  # (B, S, D)
        src_pad = torch.ones_like(src, dtype=torch.bool)  # (B, S)
        for r, w, part in zip(rows, widths, parts, strict=True):
            memory[r, :w] = part.memory
            src_pad[r, :w] = part.src_pad
        return EncoderOut(memory=memory, src_pad=src_pad)

    def decode(
        self,
        tgt_in: Tensor,
        enc: EncoderOut,
        keep: Tensor | None = None,
        packing: Packing | None = None,
        project: bool = True,
    ) -> Tensor:
        """Teacher-forced decoder: tgt_in (B, T) → logits (B, T, V), or (N, V) at the N positions
        where `keep` (B, T) is True (row-major order), so that no output projection is spent on pads.
        `packing`: the target's `Packing` on tgt_in's device, for the flash backend (the source's
        comes with `enc`); with `keep` its index selects the kept positions, which must then be
        the target's real tokens (what the trainer and validation pass). `project=False`: the
        decoder's output before the projection, (B, T, D) or (N, D); `output_weight` projects it."""
        tgt_pad = padding_mask(tgt_in, PAD_ID)
        x = self._embed(tgt_in, self.tgt_embed, self.tgt_positions)  # (B, T, D)
        for layer in self.decoder.layers:
            x = layer(x, enc, tgt_pad, packing)
        if keep is not None and packing is not None:  # the same positions, gathered without a host sync
            x = x.flatten(0, 1).index_select(0, packing.index)  # (N, D)
        elif keep is not None:
            x = x[keep]  # (N, D); a boolean index waits for the device to count N
        h = self.decoder.norm(x)
        return self._logits(h) if project else h

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        keep: Tensor | None = None,
        *,
        packing: tuple[Packing, Packing] | None = None,
        project: bool = True,
    ) -> Tensor:
        """src (B, S), tgt_in (B, T) → logits (B, T, V); masks come from PAD_ID. With `keep` (B, T)
        bool (the trainer passes ``tgt_out != PAD_ID``): packed logits (N, V) at those positions.
        `packing`: (source, target) `Packing`s of this padding, computed on the host by the batch
        builder and moved to the model's device (`nmt.batches.batching.Batch.packing`): the flash
        backend then never waits for the device. Other backends ignore it; the outputs are the same.
        `project=False`: the decoder's output before the output projection (see `decode`)."""
        src_packing, tgt_packing = packing if packing is not None else (None, None)
        return self.decode(tgt_in, self.encode(src, src_packing), keep, tgt_packing, project)

    # ----------------------------------------------------------------------- incremental decoding

    def start_decoding(self, enc: EncoderOut) -> DecoderState:
        """Computes every decoder layer's cross-attention K/V and the source mask once (one row per
        sentence); the self-attention cache is empty."""
        cross = [layer.cross_attn.memory_kv(enc.memory) for layer in self.decoder.layers]
        empty = enc.src_pad.all(dim=1)  # (N,) sources without a single real token
        return DecoderState(
            cross_k=[k for k, _ in cross],
            cross_v=[v for _, v in cross],
            src_pad=enc.src_pad,
            cross_bias=cross_attention_bias(enc.src_pad, enc.memory.dtype) if bool(enc.src_pad.any()) else None,
            cross_empty=(~empty).float()[:, None, None, None] if bool(empty.any()) else None,
            self_kv=KVCache(len(cross), enc.src_pad.size(0)),
        )

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """tokens (B,) at position `state.step` → next-token logits (B, V) in fp32; advances the state."""
        x = self._embed(tokens[:, None], self.tgt_embed, self.tgt_positions, start=state.step)  # (B, 1, D)
        for i, layer in enumerate(self.decoder.layers):
            x = layer.step(x, state, i)
        state.step += 1
        return self._logits(self.decoder.norm(x))[:, 0].float()  # (B, V)


# --------------------------------------------------------------------------- helpers


def build_model(config: Config, src_vocab: int, tgt_vocab: int) -> Transformer:
    return Transformer(config.model, src_vocab, tgt_vocab)


INIT_FUNCTIONS = ("uniform_", "normal_", "xavier_uniform_", "kaiming_uniform_", "zeros_", "ones_", "trunc_normal_")


@contextlib.contextmanager
def without_initialisation() -> Iterator[None]:
    """Inside: `torch.nn.init`'s fills are no-ops, so modules built here keep their allocated,
    unfilled tensors — for a model whose every parameter is about to be loaded. Saves the random
    initialisation's time at start-up (the meta device would too, but it imports torch._dynamo:
    seconds more, measured). Not for concurrent use: it patches the module for every thread."""
    saved = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
    try:
        for name in INIT_FUNCTIONS:
            setattr(torch.nn.init, name, _keep)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def analytic_parameter_count(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> int:
    """Closed form, with D = d_model, F = ffn_dim, Vs/Vt the vocabularies, P = max_positions:

    attention      4D^2 + 4D        (fused Q,K,V: 3D^2 + 3D; output: D^2 + D)
    FFN            2DF + F + D
    LayerNorm      2D
    encoder layer  attention + FFN + 2 LayerNorms   = 4D^2 + 2DF + F + 9D
    decoder layer  2 attentions + FFN + 3 LayerNorms = 8D^2 + 2DF + F + 15D
    final norms    2D per stack (pre-norm only)
    embeddings     (Vs + Vt) D, + 2PD for learned positions, + Vt D for an untied output projection
    """
    D, Fd = cfg.d_model, cfg.ffn_dim
    enc_layer = 4 * D * D + 2 * D * Fd + Fd + 9 * D
    dec_layer = 8 * D * D + 2 * D * Fd + Fd + 15 * D
    final = 2 * D if cfg.norm == "pre" else 0
    emb = (src_vocab + tgt_vocab) * D
    emb += 2 * cfg.max_positions * D if cfg.positions == "learned" else 0
    emb += 0 if cfg.tie_embeddings else tgt_vocab * D
    return cfg.encoder_layers * enc_layer + cfg.decoder_layers * dec_layer + 2 * final + emb


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def model_summary(model: Transformer) -> str:
    """One line: shape, parameter counts per part and the attention backend that will run."""
    cfg = model.cfg
    count = {"encoder": 0, "decoder": 0, "embeddings": 0}
    for name, p in model.named_parameters():
        count[name.split(".")[0] if name.startswith(("encoder.", "decoder.")) else "embeddings"] += p.numel()
    total = sum(count.values())
    param = next(model.parameters())
    if cfg.attention == "flash" and param.device.type == "cuda":
        backend = "flash (bf16/fp16), sdpa (fp32)"
    elif param.device.type == "meta":
        backend = cfg.attention
    else:
        backend = resolve_backend(cfg.attention, param.device, param.dtype, head_dim=cfg.d_model // cfg.heads)
    return (
        f"Transformer {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.heads} heads, FFN {cfg.ffn_dim}, {cfg.norm}-norm, {cfg.activation}, {cfg.positions} positions, "
        f"{'tied' if cfg.tie_embeddings else 'untied'} output: {_millions(total)} parameters "
        f"(encoder {_millions(count['encoder'])}, decoder {_millions(count['decoder'])}, "
        f"embeddings {_millions(count['embeddings'])}); attention backend: {backend}"
    )

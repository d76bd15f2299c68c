"""`FastDecoder`: `Transformer.decode_step` with its per-call overhead hoisted out of the step.

A step of one sentence decoded alone is a few hundred small operations on vectors of d_model
numbers; at that size the cost is the calls, not the arithmetic. The reference step
(`Transformer.decode_step` → `DecoderLayer.step` → `MultiHeadAttention.self_step`/`cross_step`,
`KVCache.append`) goes through module calls, attribute lookups and helper functions at every
layer of every step. `FastDecoder` runs the same kernels in the same order on the same tensors,
with everything that does not change between steps looked up once, when it is built:

- every linear layer is bound as its module's `forward` (no `nn.Module.__call__`; whatever the
  conversion made of it: `PackedLinear`, `Int8Linear` or `nn.Linear`);
- LayerNorm weights, heads, widths and the embedding tables are plain attributes;
- the self-attention K/V are written straight into the `KVCache` tensor (its room is checked
  once per step, not once per layer).

So its logits are the reference's bit for bit (tests/model/test_fast_decoder.py), and greedy and
beam search find the same tokens with the same scores. It decodes pre-norm models (every shipped
config); `fast_decoder` gives an ensemble's members theirs and returns the model itself for
post-norm models and for anything else (a test's stand-in). It is built after the model is converted for
decoding (`nmt.decode.precision.decoding_model`) and holds no weights of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from nmt.errors import NmtError
from nmt.model.attention import step_attention
from nmt.model.ensemble import Ensemble
from nmt.model.kv_cache import DecoderState
from nmt.model.transformer import EncoderOut, Transformer

Linear = Any  # a bound `forward` of a linear layer: (..., K) → (..., N)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's callables and LayerNorm parameters."""

    norms: tuple[tuple[Tensor, Tensor], ...]  # (weight, bias) of the self, cross and FFN blocks
    eps: float
    qkv: Linear  # self-attention [Q; K; V]
    self_out: Linear
    q: Linear  # cross-attention Q
    cross_out: Linear
    fc1: Linear
    act: Any
    fc2: Linear


def fast_decoder(model: Any) -> Any:
    """A `FastDecoder` for a pre-norm `Transformer` in eval mode; an `Ensemble` whose members step
    through theirs (the same ensemble, `steppers` set); else `model` itself."""
    if isinstance(model, Ensemble):
        model.steppers = [fast_decoder(member) for member in model.members]
        return model
    if isinstance(model, Transformer) and model.cfg.norm == "pre" and not model.training:
        return FastDecoder(model)
    return model


class FastDecoder:
    """A `nmt.contracts.DecodingModel`: `model`'s encoder and state, its own `decode_step`."""

    def __init__(self, model: Transformer) -> None:
        if model.logits_proj is None:  # the cross-attention Q rows and the tied projection as modules
            model.split_projections()
        self.model = model
        self.max_positions = model.max_positions
        self.heads, self.d_model = model.cfg.heads, model.cfg.d_model
        self.embed = model.tgt_embed.weight  # (V, D)
        self.positions = model.sinusoids if model.tgt_positions is None else model.tgt_positions.weight  # (P, D)
        self.embed_scale = model.embed_scale
        self.layers = [_bind(layer) for layer in model.decoder.layers]
        self.final_norm = (model.decoder.norm.weight, model.decoder.norm.bias, model.decoder.norm.eps)
        assert model.logits_proj is not None
        self.logits = model.logits_proj.forward

    # the model's own encoder and state: nothing there runs once per token
    def encode(self, src: Tensor) -> EncoderOut:
        return self.model.encode(src)

    def encode_by_length(self, src: Tensor) -> EncoderOut:
        return self.model.encode_by_length(src)

    def start_decoding(self, enc: EncoderOut) -> DecoderState:
        return self.model.start_decoding(enc)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """tokens (R,) at position `state.step` → next-token logits (R, V) in fp32; advances the
        state. The reference's operations (`Transformer.decode_step`) on (R, D) rows."""
        t, R, D = state.step, tokens.size(0), self.d_model
        if t >= self.max_positions:
            raise NmtError(f"sequence of {t + 1} tokens exceeds model.max_positions={self.max_positions}")
        x = F.embedding(tokens, self.embed) * self.embed_scale  # (R, D)
        x = x + self.positions[t].to(x.dtype)
        H, dk, N = self.heads, D // self.heads, state.src_pad.size(0)
        cache = None
        for i, w in enumerate(self.layers):
            (n1, b1), (n2, b2), (n3, b3) = w.norms
            qkv = w.qkv(F.layer_norm(x, (D,), n1, b1, w.eps)).view(R, 3, H, dk)  # (R, 3, H, dk)
            if cache is None:
                cache = state.self_kv.room(t, qkv[:, 1:])  # (L, 2, R, H, C, dk)
            cache[i, :, :, :, t].copy_(qkv[:, 1:].transpose(0, 1))  # this position's K and V
            kv = cache[i, :, :, :, : t + 1]  # (2, R, H, t+1, dk)
            out = step_attention(qkv[:, 0, :, None], kv[0], kv[1])  # (R, H, 1, dk)
            x = w.self_out(out.reshape(R, D)).add_(x)
            q = w.q(F.layer_norm(x, (D,), n2, b2, w.eps)).view(N, R // N, H, dk).transpose(1, 2)  # (N, H, beam, dk)
            out = step_attention(q, state.cross_k[i], state.cross_v[i], state.cross_bias)  # (N, H, beam, dk)
            if state.cross_empty is not None:
                out = out * state.cross_empty.to(out.dtype)  # no real key: zero output, as the reference
            x = w.cross_out(out.transpose(1, 2).reshape(R, D)).add_(x)
            x = w.fc2(w.act(w.fc1(F.layer_norm(x, (D,), n3, b3, w.eps)))).add_(x)  # (R, D)
        state.step += 1
        return self.logits(F.layer_norm(x, (D,), *self.final_norm)).float()  # (R, V)


def _bind(layer: Any) -> _Layer:
    norms = (layer.self_block.norm, layer.cross_block.norm, layer.ffn_block.norm)
    cross = layer.cross_attn
    assert cross.q_proj is not None, "split_projections first"
    return _Layer(
        norms=tuple((n.weight, n.bias) for n in norms),
        eps=norms[0].eps,
        qkv=layer.self_attn.in_proj.forward,
        self_out=layer.self_attn.out_proj.forward,
        q=cross.q_proj.forward,
        cross_out=cross.out_proj.forward,
        fc1=layer.ffn.fc1.forward,
        act=layer.ffn.act,
        fc2=layer.ffn.fc2.forward,
    )

"""nmt's Transformer as a CTranslate2 `TransformerSpec`: the converter behind `nmt export`.

`NmtConverter` is a `ctranslate2.converters.Converter` that builds the model with CTranslate2's
own spec API (a `TransformerSpec` of a `TransformerEncoderSpec` and a `TransformerDecoderSpec`)
and fills it from nmt's state dict:

    nmt state dict (nmt/model/transformer.py)                  CTranslate2 spec
    src_embed / tgt_embed (V, D), times sqrt(D)    encoder.embeddings[0] / decoder.embeddings (scale_embeddings)
    sinusoids or {src,tgt}_positions (P, D)        {encoder,decoder}.position_encodings.encodings (P, D)
    *.self_attn.in_proj (3D, D) rows [Wq; Wk; Wv]  *.self_attention.linear[0] (fused QKV, same order)
    *.self_attn.out_proj                           *.self_attention.linear[1]
    decoder *.cross_attn.in_proj rows [:D] / [D:]  *.attention.linear[0] (Q) / linear[1] (fused KV)
    *.cross_attn.out_proj                          *.attention.linear[2]
    *.ffn.fc1 / fc2                                *.ffn.linear_0 / linear_1
    attn_block / self_block, cross_block,          *.self_attention / attention / ffn .layer_norm
      ffn_block .norm                                (pre_norm: before the sublayer, else after the residual)
    encoder.norm / decoder.norm (pre-norm only)    encoder.layer_norm / decoder.layer_norm
    tgt_embed (tied) or output_proj (V, D)         decoder.projection

Every state-dict entry must be used and every `ModelConfig` field known here
(`check_representable`), otherwise the export is refused with one line naming the parameter or
option. Importable without the optional package (nmt/decode/ct2.py checks for it first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nmt import BOS_ID, EOS_ID, UNK_ID
from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.export.model_options import refuse_unsupported

if TYPE_CHECKING:
    import torch

try:
    from ctranslate2.converters import Converter
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:  # the optional extra is not installed
    Converter = object  # type: ignore[assignment,misc]

# ModelConfig fields and how CTranslate2 represents them. A field not listed here (a newer
# option) is refused rather than exported wrongly.
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU"}  # torch's F.gelu is the exact (erf) GELU
_SUPPORTED = {"activation": set(_ACTIVATIONS), "norm": {"pre", "post"}, "positions": {"sinusoidal", "learned"}}


def check_representable(cfg: ModelConfig) -> None:
    """NmtError naming the first model option CTranslate2's Transformer spec cannot express."""
    refuse_unsupported(cfg, _SUPPORTED, "CTranslate2")


# --------------------------------------------------------------------------- the converter


class NmtConverter(Converter):
    """Builds a CTranslate2 `TransformerSpec` from an nmt state dict (see the module docstring)."""

    def __init__(self, state: dict[str, torch.Tensor], cfg: ModelConfig, vocabs: tuple[list[str], list[str]]):
        self.state = {k: v.detach().float().cpu().numpy() for k, v in state.items()}
        self.cfg, self.vocabs = cfg, vocabs
        self.used: set[str] = set()

    def take(self, name: str) -> np.ndarray:
        """The tensor `name` of the state dict, marked as exported."""
        if name not in self.state:
            raise NmtError(f"checkpoint has no parameter {name!r} (not an nmt Transformer of this config)")
        self.used.add(name)
        return self.state[name]

    def _load(self) -> Any:
        cfg = self.cfg
        check_representable(cfg)
        pre = cfg.norm == "pre"
        act = getattr(common_spec.Activation, _ACTIVATIONS[cfg.activation])
        encoder = transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, pre_norm=pre, activation=act)
        decoder = transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, pre_norm=pre, activation=act)
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        self._fill_encoder(spec.encoder)
        self._fill_decoder(spec.decoder)
        unused = sorted(set(self.state) - self.used)
        if unused:
            raise NmtError(f"parameter {unused[0]!r} has no CTranslate2 counterpart; this model cannot be exported")
        src_vocab, tgt_vocab = self.vocabs
        spec.register_source_vocabulary(src_vocab)
        spec.register_target_vocabulary(tgt_vocab)
        c = spec.config
        c.unk_token, c.bos_token, c.eos_token = tgt_vocab[UNK_ID], tgt_vocab[BOS_ID], tgt_vocab[EOS_ID]
        c.decoder_start_token = tgt_vocab[BOS_ID]
        c.add_source_eos = True  # source = pieces + EOS, nmt's convention
        c.layer_norm_epsilon = 1e-5  # torch.nn.LayerNorm's default, used by nmt
        return spec

    def _positions(self, name: str) -> np.ndarray:
        """(P, D) position table: the learned one, or nmt's sinusoids (sin at even, cos at odd dims)."""
        if self.cfg.positions == "learned":
            return self.take(name)
        from nmt.model.transformer import sinusoidal_table

        return sinusoidal_table(self.cfg.max_positions, self.cfg.d_model).numpy()

    def _linear(self, spec: Any, prefix: str, rows: slice = slice(None)) -> None:
        spec.weight = np.ascontiguousarray(self.take(f"{prefix}.weight")[rows])
        spec.bias = np.ascontiguousarray(self.take(f"{prefix}.bias")[rows])

    def _norm(self, spec: Any, prefix: str) -> None:
        spec.gamma = self.take(f"{prefix}.weight")
        spec.beta = self.take(f"{prefix}.bias")

    def _self_attention(self, spec: Any, prefix: str, block: str) -> None:
        """A layer's fused QKV and output projections and the norm of its sublayer `block`."""
        self._linear(spec.linear[0], f"{prefix}.self_attn.in_proj")
        self._linear(spec.linear[1], f"{prefix}.self_attn.out_proj")
        self._norm(spec.layer_norm, f"{prefix}.{block}.norm")

    def _ffn(self, spec: Any, prefix: str) -> None:
        self._linear(spec.linear_0, f"{prefix}.ffn.fc1")
        self._linear(spec.linear_1, f"{prefix}.ffn.fc2")
        self._norm(spec.layer_norm, f"{prefix}.ffn_block.norm")

    def _fill_encoder(self, spec: Any) -> None:
        spec.embeddings[0].weight = self.take("src_embed.weight")
        spec.position_encodings.encodings = self._positions("src_positions.weight")
        for i, layer in enumerate(spec.layer):
            p = f"encoder.layers.{i}"
            self._self_attention(layer.self_attention, p, "attn_block")
            self._ffn(layer.ffn, p)
        if self.cfg.norm == "pre":
            self._norm(spec.layer_norm, "encoder.norm")

    def _fill_decoder(self, spec: Any) -> None:
        D = self.cfg.d_model
        spec.embeddings.weight = self.take("tgt_embed.weight")
        spec.position_encodings.encodings = self._positions("tgt_positions.weight")
        for i, layer in enumerate(spec.layer):
            p = f"decoder.layers.{i}"
            self._self_attention(layer.self_attention, p, "self_block")
            self._linear(layer.attention.linear[0], f"{p}.cross_attn.in_proj", slice(0, D))
            self._linear(layer.attention.linear[1], f"{p}.cross_attn.in_proj", slice(D, None))
            self._linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
            self._norm(layer.attention.layer_norm, f"{p}.cross_block.norm")
            self._ffn(layer.ffn, p)
        if self.cfg.norm == "pre":
            self._norm(spec.layer_norm, "decoder.norm")
        out = "tgt_embed.weight" if self.cfg.tie_embeddings else "output_proj.weight"
        spec.projection.weight = self.take(out)

"""Which model options an export format can express: one check for every format, each format
giving its own table of supported values (the shape options and the training-time ones carry
over to every runtime)."""

from __future__ import annotations

import dataclasses

from nmt.config import ModelConfig
from nmt.errors import NmtError

SHAPE = {"d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim", "max_positions", "tie_embeddings"}
NOT_IN_WEIGHTS = {"dropout", "attention_dropout", "activation_dropout", "attention"}  # training-time or kernel choices


def refuse_unsupported(cfg: ModelConfig, supported: dict[str, set[str]], runtime: str) -> None:
    """NmtError naming the first model option whose value `runtime` cannot express (`supported`:
    option → the values it can), or an option this check has never heard of (a new option must
    be judged for every format before its models export)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in supported and value not in supported[f.name]:
            raise NmtError(
                f"model.{f.name}: {value!r} cannot be exported to {runtime} "
                f"(supported: {' | '.join(sorted(supported[f.name]))})"
            )
        if f.name not in supported and f.name not in SHAPE and f.name not in NOT_IN_WEIGHTS:
            raise NmtError(f"model.{f.name}: option unknown to the {runtime} exporter; this model cannot be exported")

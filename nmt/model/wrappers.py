"""The wrappers training puts around a model, and the plain model inside them.

`wrap` adds torch.compile (train.compile) and DistributedDataParallel (a run on several ranks);
`unwrap` takes them off again wherever the model itself is meant: saving its weights, asking
whether it packs logits, reading its forward's parameters.
"""

from __future__ import annotations

import torch
from torch import nn


def wrap(model: nn.Module, compile: bool, world_size: int, device: torch.device) -> nn.Module:
    """torch.compile (when `compile`) and DistributedDataParallel (when `world_size` > 1) around
    `model`, which sits on `device` (its index is DDP's device id on CUDA)."""
    if compile:
        model = torch.compile(model)
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model

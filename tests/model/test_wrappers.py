"""The wrappers training puts around a model (nmt/model/wrappers.py), and the model inside them."""

from __future__ import annotations

import torch
from torch import nn

from nmt.model.wrappers import unwrap, wrap


class _Holder(nn.Module):
    """What DistributedDataParallel looks like from outside: the model as `.module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


class _Compiled(nn.Module):
    """What torch.compile's wrapper looks like from outside: the model as `._orig_mod`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._orig_mod = module


def test_unwrap_reaches_the_model_through_every_layer_of_wrappers():
    model = nn.Linear(2, 2)
    assert unwrap(model) is model
    assert unwrap(_Holder(_Compiled(_Holder(model)))) is model


def test_wrap_on_one_rank_without_compile_is_the_model_itself():
    model = nn.Linear(2, 2)
    assert wrap(model, compile=False, world_size=1, device=torch.device("cpu")) is model

"""An exponential moving average of the weights (``train.ema_decay``), for validation, model
selection and export.

After every optimizer update each parameter's average moves towards it:
``avg ← d · avg + (1 - d) · param`` with ``d = min(ema_decay, (1 + t) / (10 + t))`` at update t,
so the first updates are not dominated by the random initialisation (the warm-up of the decay in
TensorFlow's ExponentialMovingAverage with ``num_updates``). Buffers (the sinusoidal table) are
not averaged.

How the run uses it, when on: at each evaluation point (`nmt.train.validation.EvalHook`) the
model holds the averaged weights (`swapped`) while it is validated and while best.safetensors and
the step checkpoint are written. So every checkpoint's weights — and with them best, the average
of the last checkpoints, final and every export — are the averaged ones. The raw weights that
training continues from go into the checkpoint's trainer state (`Trainer.state_dict`'s
``raw_weights``); a resume loads the checkpoint's weights as the average and the raw weights back
into the model (`Trainer.load_state_dict`), so it continues exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class WeightAverage:
    """The running average of `model`'s parameters (on their device, in their dtype)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model, self.decay = model, decay
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        self.average = [p.detach().clone() for p in self.params]
        self._raw: dict[str, torch.Tensor] | None = None  # the model's own weights while swapped

    def rate(self, step: int) -> float:
        """The decay d used at update number `step` (1-based)."""
        return min(self.decay, (1.0 + step) / (10.0 + step))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Move the average towards the current weights after update number `step`."""
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - self.rate(step))

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The model holds the averaged weights inside, its own ones again after (exactly)."""
        self._raw = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        try:
            with torch.no_grad():
                for p, a in zip(self.params, self.average, strict=True):
                    p.copy_(a)
            yield
        finally:
            self.model.load_state_dict(self._raw)
            self._raw = None

    def raw_weights(self) -> dict[str, torch.Tensor]:
        """The model's own (not averaged) weights, on the CPU, swapped or not: what resume trains on."""
        raw = self._raw if self._raw is not None else self.model.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in raw.items()}

    @torch.no_grad()
    def restart_from_model(self) -> None:
        """The average := the model's current weights (a resume: the checkpoint's weights are the average)."""
        for a, p in zip(self.average, self.params, strict=True):
            a.copy_(p)

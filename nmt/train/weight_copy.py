"""A bf16 copy of the weights that a CPU trains in, with the fp32 model as the master weights.

Why: under autocast every linear layer casts its fp32 input and weight to bf16 on each call, layer
norm runs in fp32, and each residual sum promotes back to fp32. On a CPU, where a bf16 update is
mostly memory traffic, those conversions cost about as much as the element-wise work they wrap
(docs/benchmarks-log.md, "bf16 weights on the CPU"). Here forward and backward run on a bf16 copy
of the model, so activations stay bf16 from the embedding to the loss (whose log-softmax is still
fp32: `nmt.train.objective`), and the optimizer steps the fp32 model, the master weights. Mixed
precision with fp32 master weights is the scheme of Micikevicius et al., "Mixed Precision
Training", ICLR 2018 (no loss scaling needed: bf16 has fp32's exponent range).

Everything outside the update reads the master as before: checkpoints, the moving average,
validation, the shared-row sync (`nmt.model.shared_rows`) and exports.

How: `WeightCopy.refresh` copies the master's weights into the copy before each update, so that
whatever changed the master in between (an optimizer step, a resumed checkpoint, a sync) is what
the next forward sees; `WeightCopy.collect` adds the copy's gradients into the master's ``.grad``
in fp32 after each micro-batch's backward (gradient accumulation over ``train.update_freq``
micro-batches stays fp32) and clears them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightCopy:
    """A `dtype` copy of `master` (an unwrapped ``nn.Module``) to run forward and backward in.

    The copy is made once (``copy.deepcopy``, so tied parameters stay tied and the shared-row
    lookup reads the copy's own target table); its floating-point buffers are in `dtype` too.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.master = master
        self.model = copy.deepcopy(master).to(dtype)
        pairs = list(zip(master.parameters(), self.model.parameters(), strict=True))
        self._trained = [(m, c) for m, c in pairs if m.requires_grad]
        self._sources = [m for m, _ in pairs]
        self._targets = [c for _, c in pairs]

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the master's weights into the copy (rounded to its dtype); its train/eval mode too."""
        torch._foreach_copy_(self._targets, self._sources)
        self.model.train(self.master.training)

    @torch.no_grad()
    def collect(self) -> None:
        """Add the copy's gradients into the master's ``.grad`` (fp32) and clear the copy's."""
        for master, low in self._trained:
            if low.grad is None:
                continue
            if master.grad is None:
                master.grad = low.grad.to(master.dtype)
            else:
                master.grad.add_(low.grad)
            low.grad = None

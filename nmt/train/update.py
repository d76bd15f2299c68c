"""One optimizer update: accumulation, loss normalisation, clipping, non-finite handling.

`Trainer` works with any ``nn.Module`` whose ``forward(src, tgt_in)`` returns logits
(B, T, V), wrapped in DDP or torch.compile or not; a model that `PacksLogits` is asked for logits at the
non-pad target positions only, packed (N, V). A `nmt.data.batching.Batch` brings the host-computed
packing of its source and target; it goes to the device with the ids and on to a model whose
``forward`` takes ``packing=`` (the Transformer: its flash backend then never waits for the device).
The loss of an update is normalised by the number of target tokens summed over every micro-batch
and every rank, so one process with ``update_freq = k`` and k processes with ``update_freq = 1``
compute the same gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nmt import PAD_ID
from nmt.checkpoint import unwrap
from nmt.config import TrainConfig
from nmt.contracts import PacksLogits
from nmt.data.batching import Batch
from nmt.device import autocast, grad_scaler
from nmt.errors import NmtError
from nmt.model.masks import Packing
from nmt.train.distributed import all_reduce_sum, world_size
from nmt.train.objective import build_optimizer, label_smoothed_nll, learning_rate, set_learning_rate

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # src (B,S), tgt_in (B,T), tgt_out (B,T)
Packings = tuple[Packing, Packing] | None  # (source, target), on the device
LogitsTarget = tuple[torch.Tensor, torch.Tensor]  # (B,T,V), (B,T) or packed (N,V), (N,)


@dataclass
class TrainState:
    """Counters that a checkpoint restores (all plain ints/floats)."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # this rank's micro-batches already consumed in `epoch`
    best_bleu: float = -1.0
    best_step: int = 0
    bad_evals: int = 0  # evaluations since the last BLEU gain (early stopping)
    last_eval_step: int = -1
    nonfinite_run: int = 0  # non-finite losses in a row
    nonfinite_total: int = 0
    tokens: int = 0  # target tokens trained on (all ranks)
    elapsed: float = 0.0  # training-loop wall seconds (updates, validation, checkpoints), summed over resumed runs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainState:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class StepResult:
    step: int  # 1-based number of the update this result is (or would have been, if skipped)
    loss: float  # label-smoothed loss per target token
    nll: float  # per target token (perplexity = exp(nll))
    tokens: int  # target tokens in the update, all ranks
    grad_norm: float
    lr: float
    skipped: bool  # update not applied (non-finite loss or fp16 overflow)
    pad: int = 0  # padding slots in the update's src + tgt_out (this rank)
    slots: int = 0  # all slots in src + tgt_out (this rank)


class Trainer:
    """Owns the optimizer and loss scaler of `model`; `update()` applies one step."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, device: torch.device, state: TrainState | None = None):
        self.model, self.cfg, self.device = model, cfg, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(model, cfg)
        self.scaler = grad_scaler(device, cfg.precision)
        self.state = state or TrainState()
        self.packed = isinstance(unwrap(model), PacksLogits)  # through DDP / torch.compile
        self.takes_packing = "packing" in inspect.signature(unwrap(model).forward).parameters

    def update(self, batches: list[Batch | Tensors]) -> StepResult:
        """Forward/backward every micro-batch, then one optimizer step (or a counted skip)."""
        self.model.train()
        batches = [self._on_device(b) for b in batches]
        local = sum(int((b[2] != PAD_ID).sum()) for b in batches)
        total = all_reduce_sum(torch.tensor([float(local)], device=self.device)).item()
        scale = world_size() / total
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, nll, tokens
        for i, (src, tgt_in, tgt_out, packing) in enumerate(batches):
            with self._no_sync(last=i == len(batches) - 1):
                with autocast(self.device, self.cfg.precision):
                    logits, target = self._logits(src, tgt_in, tgt_out, packing)
                loss, nll, n = label_smoothed_nll(logits, target, self.cfg.label_smoothing)
                self.scaler.scale(loss * scale).backward()
            sums += torch.stack([loss.detach().double(), nll.double(), torch.tensor(float(n), device=self.device)])
        all_reduce_sum(sums)
        loss_tok, nll_tok = (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()
        pad = sum(int((b[0] == PAD_ID).sum() + (b[2] == PAD_ID).sum()) for b in batches)
        slots = sum(b[0].numel() + b[2].numel() for b in batches)
        number = self.state.step + 1
        lr = learning_rate(number, self.cfg)
        norm, applied = self._apply(lr, finite_loss=math.isfinite(loss_tok))
        return StepResult(number, loss_tok, nll_tok, int(total), norm, lr, not applied, pad, slots)

    def _on_device(self, batch: Batch | Tensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Packings]:
        """src, tgt_in, tgt_out and, for a `Batch` and a model that takes it, the packing, on the device."""
        if isinstance(batch, Batch) and self.takes_packing:
            batch = batch.to(self.device, non_blocking=True)
            return batch.src, batch.tgt_in, batch.tgt_out, batch.packing
        src, tgt_in, tgt_out = (t.to(self.device, non_blocking=True) for t in batch)
        return src, tgt_in, tgt_out, None

    def _logits(
        self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, packing: Packings
    ) -> LogitsTarget:
        """(logits, target): packed (N, V), (N,) for a model that packs logits, else (B, T, V), (B, T)."""
        extra = {} if packing is None else {"packing": packing}
        if not self.packed:
            return self.model(src, tgt_in, **extra), tgt_out
        keep = tgt_out != PAD_ID  # (B, T)
        return self.model(src, tgt_in, keep, **extra), tgt_out[keep]

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        if not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _apply(self, lr: float, finite_loss: bool) -> tuple[float, bool]:
        """Unscale, clip, step; skip on non-finite. Returns (grad norm, applied)."""
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if not finite_loss or (not math.isfinite(norm) and not self.scaler.is_enabled()):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():
                self.scaler.update()
            self._count_nonfinite()
            return norm, False
        self.state.nonfinite_run = 0
        set_learning_rate(self.optimizer, lr)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.step(self.optimizer)  # fp16: skipped by the scaler on inf/nan gradients
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled() and self.scaler.get_scale() < scale_before:
            return norm, False  # fp16 overflow: the scaler lowered its scale and skipped
        self.state.step += 1
        return norm, True

    def _count_nonfinite(self) -> None:
        self.state.nonfinite_run += 1
        self.state.nonfinite_total += 1
        if self.state.nonfinite_run >= self.cfg.max_nonfinite:
            raise NmtError(
                f"training diverged: {self.state.nonfinite_run} non-finite losses in a row at step "
                f"{self.state.step} (lower train.lr, raise train.warmup, or use precision fp32/bf16)"
            )

    # ----------------------------------------------------------------- checkpoint state

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": {"schedule": self.cfg.schedule, "step": self.state.step},
            "train": self.state.to_dict(),
            "rng": rng_state(),
        }

    def load_state_dict(self, d: dict, restore_rng: bool = True) -> None:
        self.optimizer.load_state_dict(d["optimizer"])
        if d.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(d["scaler"])
        self.state = TrainState.from_dict(d["train"])
        if restore_rng:
            set_rng_state(d["rng"])


def rng_state() -> dict:
    """Python, NumPy, torch (and CUDA) generator states as tensors/plain types."""
    version, words, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }  # fmt: skip


def set_rng_state(s: dict) -> None:
    py = s["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    n = s["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available() and len(s["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(s["cuda"])

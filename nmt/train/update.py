"""One optimizer update: accumulation, loss normalisation, clipping, non-finite handling.

`Trainer` works with any ``nn.Module`` whose ``forward(src, tgt_in)`` returns logits
(B, T, V), wrapped in DDP or torch.compile or not; a model that `PacksLogits` is asked for logits at the
non-pad target positions only, packed (N, V). A `nmt.batches.batching.Batch` brings the host-computed
packing of its source and target; it goes to the device with the ids and on to a model whose
``forward`` takes ``packing=`` (the Transformer: its flash backend then never waits for the device),
and its target index picks the packed targets.
The loss of an update is normalised by the number of target tokens summed over every micro-batch
and every rank, so one process with ``update_freq = k`` and k processes with ``update_freq = 1``
compute the same gradient.

`Trainer.update` is the whole update on one screen — schedule, forward and loss, backward, clip,
step — and never waits for the device: token counts come from the host (a `Batch`'s packings),
the loss, NLL and gradient norm stay device tensors, and an update whose loss or gradient norm is
not finite is skipped on the device (fused AdamW's ``found_inf``: no weight and no optimizer state
changes). `Trainer._read_back` is the one place that waits: one read-back of every issued update's
values, made into `StepResult`s of plain numbers, and the host bookkeeping: `TrainState.step`
counts an update as applied when it is issued and takes it back there if it was skipped; the
non-finite counters and the divergence abort follow. The loop asks for the results
(`Trainer.sync`) at log, evaluation and stop points; `update` reads back by itself when the issued
updates could complete a run of ``train.max_nonfinite`` non-finite losses, so training aborts at
the same update as with a read-back per step, and a checkpoint reads back first. Between a skipped
update and the read-back that finds it, the learning-rate schedule runs one update ahead per skip.
fp16 keeps one wait per update (its GradScaler decides on the host); boolean masks still wait (the
padded targets of a model that does not pack logits, the Transformer's own selection of the
``keep`` positions).

In bf16 on a CPU (one process, not compiled) forward and backward run on a bf16 copy of the
weights and the optimizer steps the fp32 model (`nmt.train.weight_copy`, `uses_weight_copy`);
elsewhere the forward runs under autocast over the fp32 weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import random
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from nmt import PAD_ID
from nmt.batches.batching import Batch
from nmt.config import TrainConfig
from nmt.contracts import PacksLogits, SplitsProjection
from nmt.errors import NmtError
from nmt.hw.device import autocast, grad_scaler, matmul_row_bucket
from nmt.model.masks import Packing
from nmt.model.row_buckets import row_buckets
from nmt.model.wrappers import unwrap
from nmt.train.alignment import GuidedAlignment, Keys
from nmt.train.distributed import all_reduce_sum, world_size
from nmt.train.ema import WeightAverage
from nmt.train.objective import (
    build_optimizer,
    label_smoothed_nll,
    learning_rate,
    projected_label_smoothed_nll,
    set_learning_rate,
)
from nmt.train.regularisers import drop_source_words, symmetric_kl
from nmt.train.weight_copy import WeightCopy

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # src (B,S), tgt_in (B,T), tgt_out (B,T)
Packings = tuple[Packing, Packing] | None  # (source, target), on the device
LogitsTarget = tuple[torch.Tensor, torch.Tensor]  # (B,T,V), (B,T) or packed (N,V), (N,)


@dataclass
class TrainState:
    """Counters that a checkpoint restores (all plain ints/floats)."""

    step: int = 0  # optimizer updates done (an issued one counts until `Trainer._read_back` finds it skipped)
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # global micro-batches (all ranks) consumed in `epoch`: the same on every rank
    best_bleu: float = -1.0
    best_step: int = 0
    bad_evals: int = 0  # evaluations since the last BLEU gain (early stopping)
    last_eval_step: int = -1
    nonfinite_run: int = 0  # non-finite losses in a row
    nonfinite_total: int = 0
    tokens: int = 0  # target tokens trained on (all ranks)
    elapsed: float = 0.0  # training-loop wall seconds (updates, validation, checkpoints), summed over resumed runs
    warmup_elapsed: float = 0.0  # `elapsed` at update train.warmup: where the budget schedules start to decay

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainState:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class StepResult:
    """One optimizer update, settled: plain numbers, read back from the device at `Trainer._read_back`."""

    step: int  # 1-based number of the update (or the number it would have had, if skipped)
    lr: float
    loss: float  # label-smoothed loss per target token
    nll: float  # per target token (perplexity = exp(nll))
    tokens: int  # target tokens in the update, all ranks
    grad_norm: float  # before clipping
    skipped: bool  # update not applied (non-finite loss or gradient, or fp16 overflow)
    nonfinite_run: int  # non-finite losses in a row, this update included
    pad: int  # padding slots in the update's src + tgt_out, this rank
    slots: int  # all slots in the update's src + tgt_out, this rank
    flops: float  # analytic training FLOPs of this rank's batches, as given to `update` (0 = not counted)
    align: float = 0.0  # train.guided_alignment's loss per copied piece (nmt/train/alignment.py), unweighted
    copied: int = 0  # copied target pieces it was computed on, all ranks (0: off, or none in the update)


class _Issued(NamedTuple):
    """An update issued and not yet read back: its host facts and its device values."""

    lr: float
    pad: int
    slots: int
    flops: float
    stats: torch.Tensor  # (7,) float64 on the device: loss sum, NLL sum, target tokens, grad norm, non-finite,
    # guided-alignment loss sum, copied pieces
    overflow: bool  # fp16: the GradScaler skipped the step (decided on the host)


def uses_weight_copy(model: nn.Module, cfg: TrainConfig, device: torch.device, precision: str) -> bool:
    """Whether `Trainer` runs forward and backward on a bf16 copy of `model`'s weights
    (`nmt.train.weight_copy`): ``train.bf16_weight_copy`` in bf16 on a CPU, for a model that is
    not wrapped (DDP and torch.compile wrap the fp32 model and keep autocast). On CUDA autocast
    stays: its fused kernels convert in registers, so there is no memory pass to save."""
    return cfg.bf16_weight_copy and device.type == "cpu" and precision == "bf16" and model is unwrap(model)


def host_counts(batch: Batch | Tensors) -> tuple[int, int, int]:
    """(target tokens, padding slots in src + tgt_out, all slots in src + tgt_out) of a micro-batch,
    from the host: a `Batch`'s packings (whose sizes are shapes, on any device), else the tensors
    (free on the CPU, a wait for the device elsewhere)."""
    src, _, tgt_out = batch
    if isinstance(batch, Batch):
        src_real, tgt_real = batch.real_tokens
    else:
        src_real, tgt_real = int((src != PAD_ID).sum()), int((tgt_out != PAD_ID).sum())
    slots = src.numel() + tgt_out.numel()
    return tgt_real, slots - src_real - tgt_real, slots


class Trainer:
    """Owns the optimizer and loss scaler of `model`; `update()` issues one step, `sync()` reads
    the issued steps back. `precision` is ``train.precision`` resolved for `device` (fp32, bf16 or
    fp16: `nmt.hw.device.training_precision`)."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        device: torch.device,
        *,
        precision: str,
        state: TrainState | None = None,
        copy_keys: Keys | None = None,
    ) -> None:
        self.model, self.cfg, self.device, self.precision = model, cfg, device, precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(model, cfg)
        self.scaler = grad_scaler(device, precision)
        self.max_norm = cfg.clip_norm if cfg.clip_norm > 0 else math.inf
        self.state = state or TrainState()
        self.packed = isinstance(unwrap(model), PacksLogits)  # through DDP / torch.compile
        self.takes_packing = "packing" in inspect.signature(unwrap(model).forward).parameters
        # the projection fused with the loss (nmt.train.objective): measured on CPUs; CUDA keeps whole logits
        self.splits = device.type == "cpu" and self.packed and isinstance(unwrap(model), SplitsProjection)
        # bf16 on a CPU: token rows padded to a few shapes per layer (torch.compile makes its own kernels)
        self.row_bucket = 0 if cfg.compile else matmul_row_bucket(device, precision, cfg.max_tokens)
        # bf16 on a CPU, one process, not compiled: forward and backward on a bf16 copy of the weights
        self.copy = WeightCopy(model) if uses_weight_copy(model, cfg, device, precision) else None
        self.forward_model = model if self.copy is None else self.copy.model
        self.compute_precision = precision if self.copy is None else "fp32"  # a bf16 copy needs no autocast
        # train.guided_alignment: a hook on the model that runs forward (nmt/train/alignment.py)
        self.guide = self._guide(copy_keys) if cfg.guided_alignment > 0 else None
        self.fused = bool(self.optimizer.defaults.get("fused"))  # its step takes found_inf: skips on the device
        self._issued: list[_Issued] = []
        self._settled: list[StepResult] = []  # read back, not yet handed out by `sync`
        # train.ema_decay: the average starts from the weights the run starts from (nmt/train/ema.py)
        self.ema = WeightAverage(unwrap(model), cfg.ema_decay) if cfg.ema_decay > 0 else None

    def update(self, batches: list[Batch | Tensors], flops: float = 0.0) -> None:
        """One optimizer update over the micro-batches `batches`, issued without waiting for the
        device: schedule, forward + loss and backward of each, clip, step (skipped on the device
        where the loss or gradient norm is not finite). `sync` reads it back; `flops` rides along."""
        self.model.train()
        if self.copy is not None:
            self.copy.refresh()
        number = self.state.step + 1
        lr = self._schedule(number)  # schedule
        counts = [host_counts(b) for b in batches]
        tokens, scale = self._normaliser(sum(c[0] for c in counts))
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, NLL, alignment loss sums; copied
        aligned = [self.guide.targets(*b) for b in batches] if self.guide is not None else []
        sums[3] = float(sum(self.guide.copied(a) for a in aligned)) if aligned else 0.0
        for i, (src, tgt_in, tgt_out, packing) in enumerate([self._on_device(b) for b in batches]):
            if self.guide is not None:
                self.guide.expect(aligned[i], self.device)
            src = drop_source_words(src, self.cfg.src_word_dropout)
            with self._no_sync(last=i == len(batches) - 1):
                objective, loss, nll = self._loss(src, tgt_in, tgt_out, packing)  # forward, loss
                objective, guided = self._guided(objective)
                self.scaler.scale(objective * scale).backward()  # backward
            if self.copy is not None:
                self.copy.collect()  # the copy's gradients into the master's, in fp32
            sums[:3] += torch.stack([loss.detach(), nll, guided]).double()
        sums = all_reduce_sum(sums)
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)  # clip
        bad = ~torch.isfinite(sums[0])  # with fp16 a non-finite gradient is the scaler's overflow
        if not self.scaler.is_enabled():
            bad |= ~torch.isfinite(norm)
        set_learning_rate(self.optimizer, lr)
        overflow = self._step(bad)  # step
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(number)
        self.state.step = number  # provisional: `sync` takes it back if the update was skipped
        stats = torch.stack([sums[0], sums[1], tokens, norm.double(), bad.double(), sums[2], sums[3]])
        pad, slots = sum(c[1] for c in counts), sum(c[2] for c in counts)
        self._issued.append(_Issued(lr, pad, slots, flops, stats, overflow))
        if len(self._issued) >= self.cfg.max_nonfinite - self.state.nonfinite_run:
            self._read_back()  # these could complete a run of max_nonfinite: abort at the update that does

    def sync(self) -> list[StepResult]:
        """Every update settled since the last call, in issue order (those still issued are read
        back first): the loop calls it at log, evaluation and stop points."""
        self._read_back()
        settled, self._settled = self._settled, []
        return settled

    def _read_back(self) -> None:
        """THE place where training waits for the device: one read-back of every issued update's
        values, then, in issue order, each one's number, `state.step` taken back for a skipped
        one, the target tokens and the non-finite counters (NmtError at ``train.max_nonfinite`` in
        a row). No-op when none is issued."""
        if not self._issued:
            return
        issued, self._issued = self._issued, []
        rows = torch.stack([u.stats for u in issued]).tolist()  # ── the one wait for the device ──
        s = self.state
        s.step -= len(issued)
        for u, (loss, nll, tokens, norm, bad, align, copied) in zip(issued, rows, strict=True):
            s.tokens += int(tokens)
            skipped = bool(bad) or u.overflow
            run = s.nonfinite_run + 1 if bad else 0
            self._settled.append(
                StepResult(s.step + 1, u.lr, loss / tokens, nll / tokens, int(tokens), norm, skipped, run,
                           u.pad, u.slots, u.flops, align / max(copied, 1), int(copied))
            )  # fmt: skip
            if bad:
                self._count_nonfinite()
            else:
                s.nonfinite_run = 0
                s.step += 0 if skipped else 1

    def _guided(self, objective: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(`objective` plus ``train.guided_alignment`` × the alignment loss the forward passes
        recorded, that loss detached): `objective` and 0 where it is off or nothing was copied."""
        extra = self.guide.take() if self.guide is not None else None
        if extra is None:
            return objective, torch.zeros((), device=objective.device)
        return objective + self.cfg.guided_alignment * extra, extra.detach()

    def _guide(self, keys: Keys | None) -> GuidedAlignment:
        if keys is None:
            raise NmtError("train.guided_alignment: needs the run's vocabularies (nmt vocab) to find copied pieces")
        return GuidedAlignment(unwrap(self.forward_model), keys)

    def _schedule(self, number: int) -> float:
        """The learning rate of update `number`; at the updates of warmup, where warmup ends for
        the budget schedules (`TrainState.warmup_elapsed`)."""
        if number <= self.cfg.warmup:
            self.state.warmup_elapsed = self.state.elapsed
        return learning_rate(number, self.cfg, self.state.elapsed, self.state.warmup_elapsed)

    def _on_device(self, batch: Batch | Tensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Packings]:
        """src, tgt_in, tgt_out and, for a `Batch` and a model that takes it, the packing, on the device."""
        if isinstance(batch, Batch) and self.takes_packing:
            batch = batch.to(self.device, non_blocking=True)
            return batch.src, batch.tgt_in, batch.tgt_out, batch.packing
        src, tgt_in, tgt_out = (t.to(self.device, non_blocking=True) for t in batch)
        return src, tgt_in, tgt_out, None

    def _normaliser(self, local: int) -> tuple[torch.Tensor, float | torch.Tensor]:
        """(target tokens of the update over all ranks, a float64 device scalar; the loss scale
        world size / that). One rank: the scale is a host float. Several: a device scalar after an
        all-reduce, rounded to fp32 as the host float would be."""
        if world_size() == 1:
            return torch.full((), float(local), dtype=torch.float64, device=self.device), 1.0 / local
        total = all_reduce_sum(torch.full((1,), float(local), dtype=torch.float64, device=self.device))[0]
        return total, (world_size() / total).float()

    def _loss(
        self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, packing: Packings
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(objective to differentiate, label-smoothed loss sum, NLL sum) of one micro-batch.

        With ``train.rdrop_alpha`` > 0 (R-Drop): two passes under different dropout masks; the loss
        and NLL are the means of the two, the objective adds α × their symmetric KL
        (`nmt.train.regularisers.symmetric_kl`). Otherwise one pass, objective = loss."""
        eps, passes = self.cfg.label_smoothing, 2 if self.cfg.rdrop_alpha > 0 else 1
        if passes == 1 and self.splits:
            with autocast(self.device, self.compute_precision), row_buckets(self.row_bucket):
                h, target = self._logits(src, tgt_in, tgt_out, packing, project=False)  # (N, D), (N,)
                weight = unwrap(self.forward_model).output_weight
                loss, nll, _ = projected_label_smoothed_nll(h, weight, target, eps, self.row_bucket)
            return loss, loss, nll
        outs = []
        for _ in range(passes):
            with autocast(self.device, self.compute_precision), row_buckets(self.row_bucket):
                logits, target = self._logits(src, tgt_in, tgt_out, packing)
            outs.append((logits, *label_smoothed_nll(logits, target, eps, packed=self.packed)[:2]))
        if passes == 1:
            return outs[0][1], outs[0][1], outs[0][2]
        (a, loss_a, nll_a), (b, loss_b, nll_b) = outs
        loss = (loss_a + loss_b) / 2
        kl = symmetric_kl(a, b, target, packed=self.packed)
        return loss + self.cfg.rdrop_alpha * kl, loss, (nll_a + nll_b) / 2

    def _logits(
        self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, packing: Packings, project: bool = True
    ) -> LogitsTarget:
        """(logits, target): packed (N, V), (N,) for a model that packs logits, else (B, T, V), (B, T).
        With a packing the packed target is gathered at its host-computed index (no read-back).
        `project=False` (a model that `SplitsProjection`): the decoder's output (N, D) instead of logits."""
        extra = {} if packing is None else {"packing": packing}
        if not project:
            extra["project"] = False
        if not self.packed:
            return self.forward_model(src, tgt_in, **extra), tgt_out
        keep = tgt_out != PAD_ID  # (B, T)
        target = tgt_out[keep] if packing is None else tgt_out.flatten()[packing[1].index]
        return self.forward_model(src, tgt_in, keep, **extra), target

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP: no gradient all-reduce before the last micro-batch of an update."""
        if not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _step(self, bad: torch.Tensor) -> bool:
        """The optimizer step unless `bad` (a flagged update changes no weight and no optimizer
        state); True when fp16's GradScaler skipped it for an overflow.

        Fused AdamW decides on the device (``found_inf``; its step counts are restored too); an
        optimizer without it reads the flag back. fp16's GradScaler decides on the host (a wait per
        update) and lowers its scale on an overflow; a non-finite loss only updates the scaler."""
        if self.scaler.is_enabled():
            if bool(bad):
                self.scaler.update()
                return False
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return self.scaler.get_scale() < scale_before
        if not self.fused:
            if not bool(bad):
                self.optimizer.step()
            return False
        self.optimizer.found_inf = bad.float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
        return False

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
        """What a checkpoint saves (issued updates are read back first). With ``train.ema_decay``
        also ``raw_weights``: the model's own weights, while the checkpoint's weights are the average."""
        self._read_back()
        raw = {"raw_weights": self.ema.raw_weights()} if self.ema is not None else {}
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": {"schedule": self.cfg.schedule, "step": self.state.step},
            "train": self.state.to_dict(),
            "rng": rng_state(),
            **raw,
        }

    def load_state_dict(self, d: dict, restore_rng: bool = True) -> None:
        """Restore a checkpoint's trainer state into this trainer, whose model holds the checkpoint's
        weights. Where the checkpoint kept ``raw_weights`` (an EMA run), those go back into the
        model and the checkpoint's weights become the average (`nmt.train.ema`)."""
        if "raw_weights" in d:
            if self.ema is not None:
                self.ema.restart_from_model()
            unwrap(self.model).load_state_dict(d["raw_weights"])
        self.optimizer.load_state_dict(d["optimizer"])
        if d.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(d["scaler"])
        self.state = TrainState.from_dict(d["train"])
        self._issued, self._settled = [], []
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

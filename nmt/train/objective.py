"""Training objective and optimisation: label-smoothed cross-entropy, AdamW, LR schedules."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt import PAD_ID
from nmt.config import TrainConfig
from nmt.config_values import parse_duration
from nmt.errors import NmtError
from nmt.model.row_buckets import padded_rows


def _smoothed_rows(lprobs: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, nll) per row of log-probabilities lprobs (N, V) for targets (N,):
    nll = -lp[y], loss = (1 - ε) · nll - ε · mean_v lp."""
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)  # (N,)
    return (1.0 - epsilon) * nll - epsilon * lprobs.mean(dim=-1), nll


def _smoothed_grad_(lprobs: torch.Tensor, target: torch.Tensor, epsilon: float) -> torch.Tensor:
    """d loss / d logits = softmax - ε/V - (1 - ε) · onehot(y), built in lprobs' own buffer (N, V)."""
    grad = lprobs.exp_().sub_(epsilon / lprobs.size(1))
    return grad.scatter_add_(1, target[:, None], lprobs.new_full((target.numel(), 1), -(1.0 - epsilon)))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-row label-smoothed cross-entropy of (N, V) logits with a hand-written backward.

    Forward: one log-softmax lp (N, V) and `_smoothed_rows`. Backward: `_smoothed_grad_` in one
    (N, V) buffer. Autograd through log_softmax → gather → mean would materialise several (N, V)
    tensors (scatter into zeros, the broadcast division of the mean, the log-softmax backward).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
        lprobs = F.log_softmax(logits, dim=-1)  # (N, V)
        loss, nll = _smoothed_rows(lprobs, target, epsilon)
        ctx.save_for_backward(lprobs, target)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        lprobs, target = ctx.saved_tensors
        grad = _smoothed_grad_(lprobs.clone(), target, ctx.epsilon)  # (N, V)
        return grad.mul_(grad_loss[:, None]), None, None


CHUNK_ELEMENTS = 1 << 20  # logits (rows × V) a chunk of `projected_label_smoothed_nll` holds in fp32: 4 MiB


def chunk_rows(vocab: int) -> int:
    """Rows per chunk of `projected_label_smoothed_nll` for a vocabulary of `vocab`: the power of
    two that keeps a chunk's fp32 logits within CHUNK_ELEMENTS, between 16 and 1,024 rows."""
    rows = 1 << max(CHUNK_ELEMENTS // vocab, 1).bit_length() - 1
    return min(max(rows, 16), 1024)


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """Sums of the label-smoothed loss and NLL of the logits h · Wᵀ, a chunk of rows at a time.

    h (N, D) and W (V, D) come in the matmul dtype (bf16 under autocast). Each chunk's logits go to
    fp32, through the log-softmax and `_smoothed_rows`, and become d loss / d logits
    (`_smoothed_grad_`) while they are still in cache; only that gradient, in the matmul dtype, is
    kept for the backward, which is two matmuls: d h = G · W and d W = Gᵀ · h. Rows past `n` (the
    padding of `nmt.model.row_buckets`) count nothing and get a zero gradient.
    """

    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, vocab = h.size(0), weight.size(0)
        step = chunk_rows(vocab)
        grad = h.new_empty(rows, vocab)  # (R, V) d loss / d logits, in the matmul dtype
        sums = torch.zeros(2, dtype=torch.float32, device=h.device)  # loss, NLL
        for start in range(0, rows, step):
            real = max(min(step, n - start), 0)  # rows of this chunk below n
            if real == 0:
                grad[start : start + step].zero_()
                continue
            lprobs = F.log_softmax(F.linear(h[start : start + step], weight).float(), dim=-1)  # (C, V)
            if real < lprobs.size(0):
                grad[start + real : start + step].zero_()
                lprobs = lprobs[:real]
            y = target[start : start + real]
            loss, nll = _smoothed_rows(lprobs, y, epsilon)
            sums += torch.stack([loss.sum(), nll.sum()])
            grad[start : start + real] = _smoothed_grad_(lprobs, y, epsilon)
        ctx.save_for_backward(h, weight, grad)
        loss_sum, nll_sum = sums.unbind()
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, weight, grad = ctx.saved_tensors
        scale = grad_loss.to(h.dtype)
        return (grad @ weight) * scale, (grad.t() @ h) * scale, None, None, None


def projected_label_smoothed_nll(
    h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float, bucket: int = 0
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`label_smoothed_nll` of the packed logits h · Wᵀ without holding them: h (N, D) the
    decoder's output at the N real target positions, W (V, D) the output projection, target (N,)
    with no padding. Under autocast the matmuls run in its dtype, the log-softmax in fp32. With
    `bucket` the rows are padded to a multiple of it first (`nmt.model.row_buckets.padded_rows`),
    so that the matmuls come in a few shapes. Returns (loss sum, NLL sum, N)."""
    n = target.numel()
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        h, weight = h.to(dtype), weight.to(dtype)
    h = F.pad(h, (0, 0, 0, padded_rows(n, bucket) - n))  # (R, D)
    with torch.autocast(device_type, enabled=False):
        loss, nll = _ProjectedSmoothedCrossEntropy.apply(h, weight, target, epsilon, n)
    return loss, nll, n


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID, packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed cross-entropy over non-pad target positions.

    logits (..., V) and target (...) of matching leading shapes: (B, T, V) and (B, T), or
    logits already packed to the real positions, (N, V) and (N,). With p = softmax(logits) in
    fp32, per position:

        loss = (1 - ε) · (-log p[y]) + ε · mean_v(-log p[v])

    i.e. the smoothing mass ε is spread uniformly over all V classes (the same definition as
    ``F.cross_entropy(label_smoothing=ε)``). Returns (loss sum, plain NLL sum, token count);
    divide by the token count for the per-token loss (the NLL gives the perplexity).
    `packed=True` promises that `target` holds no `ignore_index` (logits packed to the real
    positions, the training path): nothing is masked and the count is the target's size, so
    nothing is read back from the device. Otherwise the pad mask is counted on the host.
    """
    logits = logits.float().flatten(0, -2)  # (N, V)
    target = target.reshape(-1)
    n = target.numel()
    if not packed:
        mask = target != ignore_index
        n = int(mask.sum())
        if n < target.numel():  # already packed logits skip this (N, V) copy
            logits, target = logits[mask], target[mask]
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    return loss.sum(), nll.sum(), n


def decay_shape(progress: float, shape: str) -> float:
    """The decay from 1 (progress 0) to 0 (progress 1) shared by every annealing schedule:
    ``linear`` is 1 - progress, ``cosine`` half a cosine, 0.5 · (1 + cos(π · progress)).
    Progress is clamped to [0, 1], so a schedule stays at its floor once it is through."""
    progress = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(step: int, cfg: TrainConfig, elapsed: float = 0.0, warmup_elapsed: float = 0.0) -> float:
    """Multiplier of ``train.lr`` for optimizer update number `step` (1-based).

    - ``inverse_sqrt``: ``min(step / warmup, sqrt(warmup / step))`` — linear warm-up to the
      peak at ``step == warmup``, then decay ∝ 1/sqrt(step) (Vaswani et al., 2017, §5.3,
      with the peak set by ``train.lr`` instead of d_model^-0.5). ``warmup = 0`` is treated
      as 1, i.e. no warm-up and 1/sqrt(step) decay.
    - ``cosine``: linear warm-up over ``warmup`` steps, then half a cosine from ``lr`` down
      to ``min_lr`` at ``max_steps``; ``min_lr`` after that.
    - ``budget-linear`` / ``budget-cosine``: linear warm-up over ``warmup`` steps, then from
      ``lr`` down to ``min_lr`` (linearly / half a cosine) on the fraction of the time budget
      ``train.max_time`` spent since the warm-up ended: progress = (elapsed - warmup_elapsed)
      / (budget - warmup_elapsed), so the rate reaches its floor when the budget stops the run
      (Li, Yumer & Ramanan, "Budgeted Training: Rethinking Deep Neural Network Training Under
      Resource Constraints", ICLR 2020: a schedule that anneals to zero at the end of the
      budget beats off-the-shelf ones, most of all for small budgets).
      `elapsed` is the seconds of the budget used before this update (`TrainState.elapsed`),
      on the clock `train.max_time` stops on (`nmt.train.stopping`): training-loop wall time,
      validation and checkpoint writes included. Those pauses use up the budget the user set
      as surely as updates do; a clock without them would leave the rate above its floor at the
      stop. `warmup_elapsed` is that clock at update ``warmup`` (`TrainState.warmup_elapsed`).
      Both are saved in every checkpoint, so a resumed run continues the same curve.
    """
    step = max(step, 1)
    warmup = max(cfg.warmup, 1)
    if cfg.schedule == "inverse_sqrt":
        return min(step / warmup, math.sqrt(warmup / step))
    budget = parse_duration(cfg.max_time) if cfg.schedule.startswith("budget-") else 0.0
    if cfg.schedule.startswith("budget-") and budget <= 0:
        raise NmtError(f"train.schedule: {cfg.schedule} needs train.max_time (it decays to min_lr at the budget)")
    if cfg.schedule == "cosine" and cfg.max_steps <= 0:
        raise NmtError("train.schedule: cosine needs train.max_steps > 0 (it decays to min_lr at max_steps)")
    if step < warmup:
        return step / warmup
    floor = cfg.min_lr / cfg.lr
    if budget:
        progress = (elapsed - warmup_elapsed) / max(budget - warmup_elapsed, 1e-9)
        return floor + (1.0 - floor) * decay_shape(progress, cfg.schedule.removeprefix("budget-"))
    span = max(cfg.max_steps - warmup, 1)
    return floor + (1.0 - floor) * decay_shape((step - warmup) / span, "cosine")


def learning_rate(step: int, cfg: TrainConfig, elapsed: float = 0.0, warmup_elapsed: float = 0.0) -> float:
    """``train.lr`` × `lr_factor` (same arguments)."""
    return cfg.lr * lr_factor(step, cfg, elapsed, warmup_elapsed)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (fused where the parameters allow); weight decay only on matrices (not on biases,
    norms or 1-d parameters)."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel updates every tensor in one pass (docs/BENCHMARKS.md, training throughput).
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=learning_rate(1, cfg), betas=cfg.betas, eps=cfg.eps, fused=fused)

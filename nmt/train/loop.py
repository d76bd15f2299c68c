"""Training: data stream, model, DDP, validation, checkpoints, stopping, resume.

``train(config, run_dir)`` reads ``<run>/bin`` through memory-mapped ``ParallelSplit``s (memory
does not grow with the corpus), builds the model, and loops over optimizer updates (see
``nmt.train.update``) until the first of ``max_steps`` / ``max_epochs`` / ``max_time`` /
early stopping (``patience`` evaluations without a validation BLEU gain; ``nmt.train.stopping``).
Every ``eval_every`` updates — and once at the end — it validates and checkpoints
(``nmt.train.validation.EvalHook``).

Re-running on a run directory with checkpoints resumes from the newest complete one
(``nmt.train.resume``) and continues exactly as if it had never stopped: same data position, RNG
states, optimizer and schedule (bit-identical on one process; with several ranks only rank
0's RNG is saved, the other ranks are reseeded from (seed, rank, step)). ``max_time`` is a
budget of training-loop wall time — updates, validation and checkpoint writes — summed over
all resumed invocations (``nmt.train.stopping`` says exactly what counts).

The pieces, one seam each: `TrainData` (this rank's batches, tokenizers, validator),
`build_seeded` / `wrap` (the model), `resume_checkpoint` (resume), `StoppingRules` (when to
stop), `EvalHook` (validation and checkpoints), `TrainLog` + `_Progress` (logging); `_Run`
only wires them together and runs the loop.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt import checkpoint as ckpt
from nmt.config import Config
from nmt.data.batching import TokenBatchSampler, load_batch
from nmt.data.vocab import check_vocab_copied
from nmt.device import check_precision, describe, resolve_device, set_threads
from nmt.runlog import TB_DIR, format_values
from nmt.train.distributed import DistInfo, barrier, init_distributed, teardown
from nmt.train.progress import TrainLog
from nmt.train.resume import init_weights, reshard, resume_checkpoint
from nmt.train.stopping import StoppingRules
from nmt.train.update import StepResult, Trainer, TrainState
from nmt.train.validation import EvalHook, Validator

ModelBuilder = Callable[[Config, int, int], nn.Module]


def train(config: Config, run_dir: Path, restart: bool = False) -> dict:
    """Train (or resume) the run's model; returns a summary (empty on non-main ranks).

    Clears the pipeline's "train" stamp first: until this call returns, the run's
    checkpoints are not a finished training run.
    """
    from nmt.runs import clear_stamp

    clear_stamp(run_dir, "train")
    return fit(config, run_dir, restart=restart)


def fit(
    config: Config,
    run_dir: Path,
    restart: bool = False,
    build: ModelBuilder | None = None,
    on_step: Callable[[StepResult], None] | None = None,
) -> dict:
    """`train` with hooks: `build(config, src_vocab, tgt_vocab)` replaces `nmt.model.transformer.build_model`
    (any module with ``forward(src, tgt_in) -> logits`` works), `on_step` sees every update."""
    device = resolve_device(config.train.device)
    info, device = init_distributed(device)
    try:
        return _Run(config, Path(run_dir), device, info, restart, build).loop(on_step)
    finally:
        teardown()


# --------------------------------------------------------------------------- data and model


class _Stream:
    """This rank's micro-batches in order, across epochs, from the position in TrainState."""

    def __init__(self, sampler: TokenBatchSampler) -> None:
        self.sampler = sampler
        self._epoch, self._order = -1, []

    def take(self, state: TrainState, k: int) -> list[np.ndarray]:
        """Up to k batches from the current epoch (a group never spans two epochs)."""
        if self._epoch != state.epoch:
            self._epoch, self._order = state.epoch, self.sampler.epoch_batches(state.epoch)
        group = self._order[state.batch_in_epoch : state.batch_in_epoch + k]
        state.batch_in_epoch += len(group)
        if state.batch_in_epoch >= len(self._order):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        return group


@dataclass
class TrainData:
    """This rank's training batches, the run's tokenizers (None without a vocab) and, on rank 0, the validator."""

    dataset: Any  # ParallelSplit of "train"
    sampler: TokenBatchSampler
    stream: _Stream
    src_tok: Any
    tgt_tok: Any
    validator: Validator | None

    @classmethod
    def open(cls, config: Config, run_dir: Path, device: torch.device, info: DistInfo) -> TrainData:
        from nmt.data.encoded import ParallelSplit

        t = config.train
        dataset = ParallelSplit.open(run_dir, "train", config)
        sampler = TokenBatchSampler(
            dataset.src_lengths, dataset.tgt_lengths, t.max_tokens, t.max_len,
            seed=t.seed, rank=info.rank, world_size=info.world_size,
        )  # fmt: skip
        src_tok = tgt_tok = validator = None
        if (run_dir / "vocab").is_dir():
            from nmt.data.tokenizer import load_tokenizers

            src_tok, tgt_tok = load_tokenizers(run_dir, config)
        if info.is_main:
            valid = ParallelSplit.open(run_dir, "valid", config)
            validator = Validator(config, run_dir, valid, device, tgt_tok)
        return cls(dataset, sampler, _Stream(sampler), src_tok, tgt_tok, validator)

    def vocab_sizes(self, config: Config) -> tuple[int, int]:
        """(source, target) vocabulary sizes: the tokenizers', else the config's."""
        src = self.src_tok.vocab_size if self.src_tok else config.vocab.src_size
        return src, self.tgt_tok.vocab_size if self.tgt_tok else config.vocab.tgt_size

    def describe(self) -> str:
        s = self.sampler
        return (
            f"data: {s.kept} pairs in {len(s.batches)} batches ({len(s)} per rank per epoch), "
            f"{s.skipped} skipped (> train.max_len), padding waste {s.padding_waste:.1%}"
        )


def build_seeded(config: Config, vocab: tuple[int, int], device: torch.device, build: ModelBuilder | None) -> nn.Module:
    """The model (`build`, default `nmt.model.transformer.build_model`), every generator seeded with train.seed."""
    if build is None:
        from nmt.model.transformer import build_model as build
    seed = config.train.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return build(config, *vocab).to(device)


def wrap(model: nn.Module, config: Config, info: DistInfo, device: torch.device) -> nn.Module:
    """torch.compile (train.compile) and DistributedDataParallel (several ranks) around `model`."""
    if config.train.compile:
        model = torch.compile(model)
    if info.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    return model


def describe_model(model: nn.Module) -> str:
    """`nmt.model.transformer.model_summary`, or a parameter count for other modules."""
    try:
        from nmt.model.transformer import model_summary

        return model_summary(model)
    except (ImportError, AttributeError, TypeError):
        n = sum(p.numel() for p in model.parameters())
        return f"{type(model).__name__}: {n / 1e6:.2f}M parameters"


# --------------------------------------------------------------------------- the loop


class _Run:
    """One invocation of training on one rank: set-up, then `loop()`."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        device: torch.device,
        info: DistInfo,
        restart: bool,
        build: ModelBuilder | None,
    ) -> None:
        t = config.train
        self.config, self.device, self.info = config, device, info
        self.rules = StoppingRules(config)
        check_precision(device, t.precision)
        set_threads(t.threads)
        self.ckpt_dir = run_dir / "checkpoints"
        if restart and info.is_main:
            ckpt.clear_checkpoints(self.ckpt_dir)
            shutil.rmtree(run_dir / TB_DIR, ignore_errors=True)
        barrier()  # no rank may look for checkpoints before rank 0 has cleared them
        self.data = TrainData.open(config, run_dir, device, info)
        self.model = build_seeded(config, self.data.vocab_sizes(config), device, build)
        self.resumed = resume_checkpoint(self.model, self.ckpt_dir)
        if self.resumed.path is None and t.init_from:
            check_vocab_copied(config, run_dir)
            self.resumed.notes.append(init_weights(self.model, config))
        self.trainer = Trainer(wrap(self.model, config, info, device), t, device)
        if self.resumed.state is not None:
            self.trainer.load_state_dict(self.resumed.state, restore_rng=info.is_main)
            note = reshard(self.trainer.state, self.resumed.state.get("world_size", 1), info.world_size)
            self.resumed.notes += [note] if note else []
        if not info.is_main:
            torch.manual_seed(t.seed + 7919 * info.rank + self.trainer.state.step)
        self.state = self.trainer.state
        self.log = TrainLog(run_dir, info.is_main, t.max_steps or None, self.state.step)
        self.evaluate = EvalHook(config, self.ckpt_dir, self.data.validator, self.log, info.world_size)

    def loop(self, on_step: Callable[[StepResult], None] | None = None) -> dict:
        """Update until a stopping rule fires, validate/checkpoint once more; the summary (rank 0)."""
        self.on_step = on_step
        with self.log:
            self._describe()
            self.progress = _Progress(self.log, self.config.train.log_every, len(self.data.sampler))
            self.rules.start_clock(self.state)
            stop = self.rules.before_update(self.state)
            while stop is None:
                self._one_update()
                evaluated = self.evaluate.due(self.state.step, self.state.last_eval_step)
                if evaluated:
                    self._evaluate()
                after = self.rules.after_update(self.state, evaluated, self.device, self.info.world_size)
                stop = self.rules.before_update(self.state) or after
            if self.state.last_eval_step != self.state.step or ckpt.latest_checkpoint(self.ckpt_dir) is None:
                self._evaluate()
            barrier()
            self.log.line(self.rules.describe(stop, self.state))
        return self._summary(stop) if self.info.is_main else {}

    def _evaluate(self) -> None:
        self.evaluate(self.model, self.trainer, lambda: self.rules.tick(self.state))

    def _one_update(self) -> None:
        s = self.state
        start = time.monotonic()
        group = self.data.stream.take(s, self.config.train.update_freq)
        result = self.trainer.update([load_batch(self.data.dataset, idx) for idx in group])
        seconds = time.monotonic() - start
        s.tokens += result.tokens
        if self.on_step is not None:
            self.on_step(result)
        self.progress.record(result, seconds, s)

    def _describe(self) -> None:
        for note in self.resumed.notes:
            self.log.line(note)
        self.log.line(describe_model(self.model))
        self.log.line(f"device: {describe(self.device, self.config.train.precision)}, ranks {self.info.world_size}")
        self.log.line(self.data.describe())
        if self.resumed.path is not None:
            self.log.line(f"resumed from {self.resumed.path} (step {self.state.step}, epoch {self.state.epoch})")

    def _summary(self, stop: str | None) -> dict:
        s, valid = self.state, self.evaluate.last
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        return {
            "steps": s.step,
            "epochs": round(self.progress.epochs(s), 3),
            "best_bleu": s.best_bleu,
            "best_step": s.best_step,
            "valid_bleu": valid.get("bleu", s.best_bleu),
            "valid_loss": valid.get("loss", float("nan")),
            "tokens_per_s": self.progress.speed,
            "elapsed_s": s.elapsed,  # training-loop wall time over all invocations (what max_time limits)
            "nonfinite": s.nonfinite_total,
            "stopped": stop or "",
            "checkpoint": str(latest) if latest else "",
        }


class _Progress:
    """Per-update output: the bar (loss, lr, speed), skipped-update lines, train/* scalars every log_every."""

    def __init__(self, log: TrainLog, log_every: int, batches_per_epoch: int) -> None:
        self.log, self.log_every, self.batches_per_epoch = log, log_every, max(batches_per_epoch, 1)
        self.window, self.tokens, self.seconds = _Window(), 0, 0.0

    @property
    def speed(self) -> float:
        """Target tokens per second of update time in this invocation (validation excluded)."""
        return self.tokens / max(self.seconds, 1e-9)

    def epochs(self, s: TrainState) -> float:
        return s.epoch + s.batch_in_epoch / self.batches_per_epoch

    def record(self, result: StepResult, seconds: float, s: TrainState) -> None:
        self.tokens, self.seconds = self.tokens + result.tokens, self.seconds + seconds
        if result.skipped:
            self.log.line(f"step {s.step + 1}: non-finite loss/gradient, update skipped ({s.nonfinite_run} in a row)")
            return
        self.window.add(result)
        self.log.advance(s.step, f"loss {result.loss:.3f} lr {result.lr:.2e} {self.speed:,.0f} tok/s")
        if s.step % self.log_every == 0:
            values, self.window = self.window.values(), _Window()
            values["epoch"] = self.epochs(s)
            self.log.scalars("train", values, s.step)
            self.log.line(f"step {s.step} | " + format_values(values))


class _Window:
    """Train statistics between two log lines."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.loss = self.nll = self.norm = 0.0
        self.tokens = self.steps = self.pad = self.slots = 0
        self.lr = 0.0

    def add(self, r: StepResult) -> None:
        self.loss += r.loss * r.tokens
        self.nll += r.nll * r.tokens
        self.tokens += r.tokens
        self.norm += r.grad_norm
        self.steps += 1
        self.pad, self.slots, self.lr = self.pad + r.pad, self.slots + r.slots, r.lr

    def values(self) -> dict[str, Any]:
        n = max(self.tokens, 1)
        seconds = max(time.monotonic() - self.t0, 1e-9)
        return {
            "loss": self.loss / n,
            "ppl": float(np.exp(min(self.nll / n, 50.0))),
            "lr": self.lr,
            "grad_norm": self.norm / max(self.steps, 1),
            "tokens_per_s": self.tokens / seconds,
            "padding_waste": self.pad / max(self.slots, 1),
        }

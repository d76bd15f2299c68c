"""Training: data stream, model, DDP, validation, checkpoints, stopping, resume.

``train(config, run_dir)`` reads ``<run>/bin`` through memory-mapped ``ParallelSplit``s (memory
does not grow with the corpus), builds the model, and loops over optimizer updates (see
``nmt.trainer``) until the first of ``max_steps`` / ``max_epochs`` / ``max_time`` /
early stopping (``patience`` evaluations without a validation BLEU gain). Every
``eval_every`` updates — and once at the end — it validates and checkpoints.

Re-running on a run directory with checkpoints resumes from the newest complete one and
continues exactly as if it had never stopped: same data position, RNG states, optimizer
and schedule (bit-identical on one process; with several ranks only rank 0's RNG is saved,
the other ranks are reseeded from (seed, rank, step)). ``max_time`` counts the training
time of all resumed invocations together.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt import checkpoint as ckpt
from nmt.batching import TokenBatchSampler, load_batch
from nmt.config import Config, parse_duration
from nmt.device import check_precision, describe, resolve_device, set_threads
from nmt.distributed import DistInfo, barrier, broadcast, init_distributed, teardown
from nmt.errors import NmtError
from nmt.trainer import StepResult, Trainer, TrainState
from nmt.trainlog import TrainLog, format_values
from nmt.validation import Validator

ModelBuilder = Callable[[Config, int, int], nn.Module]
STOP_CODES = {1: "max_time", 2: "patience"}


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
    """`train` with hooks: `build(config, src_vocab, tgt_vocab)` replaces `nmt.model.build_model`
    (any module with ``forward(src, tgt_in) -> logits`` works), `on_step` sees every update."""
    device = resolve_device(config.train.device)
    info, device = init_distributed(device)
    try:
        run = _Run(config, Path(run_dir), device, info, restart, build, on_step)
        return run.loop()
    finally:
        teardown()


def check_stopping(config: Config) -> float:
    """Seconds of the time budget (0 = none); NmtError when nothing would ever stop training."""
    t = config.train
    budget = parse_duration(t.max_time)
    if not (t.max_steps or t.max_epochs or budget or t.patience):
        raise NmtError("train: no stopping rule: set train.max_steps, max_epochs, max_time or patience")
    return budget


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


class _Run:
    def __init__(
        self,
        config: Config,
        run_dir: Path,
        device: torch.device,
        info: DistInfo,
        restart: bool,
        build: ModelBuilder | None,
        on_step: Callable[[StepResult], None] | None,
    ) -> None:
        self.config, self.run_dir, self.device, self.info, self.on_step = config, run_dir, device, info, on_step
        t = config.train
        self.budget = check_stopping(config)
        check_precision(device, t.precision)
        set_threads(t.threads)
        self.ckpt_dir = run_dir / "checkpoints"
        self.notes: list[str] = []
        if restart and info.is_main:
            ckpt.clear_checkpoints(self.ckpt_dir)
            shutil.rmtree(run_dir / "tb", ignore_errors=True)
        barrier()  # no rank may look for checkpoints before rank 0 has cleared them
        self._open_data()
        self.model = self._build_model(build)
        resumed = self._resume()
        self.wrapped = self._wrap(self.model)
        self.trainer = Trainer(self.wrapped, t, device)
        if resumed is not None:
            self.trainer.load_state_dict(resumed[1], restore_rng=info.is_main)
            self._check_world_size(resumed[1].get("world_size", 1))
        if not info.is_main:
            torch.manual_seed(t.seed + 7919 * info.rank + self.trainer.state.step)
        self.state = self.trainer.state
        total = t.max_steps or None
        self.log = TrainLog(run_dir, info.is_main, total, self.state.step)
        self.resumed_from = resumed[0] if resumed else None

    # ----------------------------------------------------------------- set-up

    def _open_data(self) -> None:
        from nmt.data import ParallelSplit

        t, info = self.config.train, self.info
        self.train_ds = ParallelSplit.open(self.run_dir, "train", self.config)
        self.sampler = TokenBatchSampler(
            self.train_ds.src_lengths, self.train_ds.tgt_lengths, t.max_tokens, t.max_len,
            seed=t.seed, rank=info.rank, world_size=info.world_size,
        )  # fmt: skip
        self.stream = _Stream(self.sampler)
        self.src_tok = self.tgt_tok = None
        if (self.run_dir / "vocab").is_dir():
            from nmt.vocab import load_tokenizers

            self.src_tok, self.tgt_tok = load_tokenizers(self.run_dir, self.config)
        self.validator = None
        if info.is_main:
            valid = ParallelSplit.open(self.run_dir, "valid", self.config)
            self.validator = Validator(self.config, self.run_dir, valid, self.device, self.tgt_tok)

    def _build_model(self, build: ModelBuilder | None) -> nn.Module:
        if build is None:
            from nmt.model import build_model as build
        src_v = self.src_tok.vocab_size if self.src_tok else self.config.vocab.src_size
        tgt_v = self.tgt_tok.vocab_size if self.tgt_tok else self.config.vocab.tgt_size
        seed = self.config.train.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        return build(self.config, src_v, tgt_v).to(self.device)

    def _resume(self) -> tuple[Path, dict] | None:
        """Load the newest checkpoint whose files read back completely; skip broken ones."""
        for weights in ckpt.complete_checkpoints(self.ckpt_dir):
            try:
                tensors, _ = ckpt.load_weights(weights)
                state = ckpt.load_trainer_state(weights)
            except (NmtError, RuntimeError, OSError, EOFError, ValueError) as e:
                self.notes.append(f"skipping unreadable checkpoint {weights.name}: {e}")
                continue
            try:
                self.model.load_state_dict(tensors)
            except RuntimeError as e:
                first = str(e).strip().splitlines()[-1].strip()
                raise NmtError(f"{weights}: does not fit the configured model ({first}); use --restart") from None
            return weights, state
        return None

    def _check_world_size(self, saved: int) -> None:
        """A different rank count reshards the data: continue from the start of the next epoch."""
        if saved != self.info.world_size and self.trainer.state.batch_in_epoch:
            self.notes.append(
                f"resuming on {self.info.world_size} ranks (saved with {saved}): data restarts at the next epoch"
            )
            self.trainer.state.epoch += 1
            self.trainer.state.batch_in_epoch = 0

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.config.train.compile:
            model = torch.compile(model)
        if self.info.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        return model

    def _describe(self) -> None:
        try:
            from nmt.model import model_summary

            text = model_summary(self.model)
        except (ImportError, AttributeError, TypeError):
            n = sum(p.numel() for p in self.model.parameters())
            text = f"{type(self.model).__name__}: {n / 1e6:.2f}M parameters"
        s = self.sampler
        for note in self.notes:
            self.log.line(note)
        self.log.line(text)
        self.log.line(f"device: {describe(self.device, self.config.train.precision)}, ranks {self.info.world_size}")
        self.log.line(
            f"data: {s.kept} pairs in {len(s.batches)} batches ({len(s)} per rank per epoch), "
            f"{s.skipped} skipped (> train.max_len), padding waste {s.padding_waste:.1%}"
        )
        if self.resumed_from is not None:
            self.log.line(f"resumed from {self.resumed_from} (step {self.state.step}, epoch {self.state.epoch})")

    # ----------------------------------------------------------------- loop

    def loop(self) -> dict:
        with self.log:
            self._describe()
            self.t0, self.elapsed0, self.train_s, self.tokens0 = time.monotonic(), self.state.elapsed, 0.0, 0
            self.window = _Window()
            stop = self._limit_reached()
            while stop is None:
                self._one_update()
                stop = self._limit_reached() or self._after_update()
            if self.state.last_eval_step != self.state.step or ckpt.latest_checkpoint(self.ckpt_dir) is None:
                self._evaluate_and_save()
            barrier()
            self.log.line(f"stopped: {stop} at step {self.state.step}")
        return self._summary(stop) if self.info.is_main else {}

    def _one_update(self) -> None:
        t = self.config.train
        start = time.monotonic()
        group = self.stream.take(self.state, t.update_freq)
        result = self.trainer.update([load_batch(self.train_ds, idx) for idx in group])
        self.train_s += time.monotonic() - start
        self.state.tokens += result.tokens
        self.tokens0 += result.tokens
        self.state.elapsed = self.elapsed0 + time.monotonic() - self.t0
        if self.on_step is not None:
            self.on_step(result)
        if result.skipped:
            self.log.line(f"step {self.state.step + 1}: non-finite loss/gradient, update skipped "
                          f"({self.state.nonfinite_run} in a row)")  # fmt: skip
            return
        self.window.add(result)
        speed = self.tokens0 / max(self.train_s, 1e-9)
        self.log.advance(self.state.step, f"loss {result.loss:.3f} lr {result.lr:.2e} {speed:,.0f} tok/s")
        if self.state.step % t.log_every == 0:
            self._log_train()

    def _log_train(self) -> None:
        values = self.window.values()
        self.window = _Window()
        values["epoch"] = self.state.epoch + self.state.batch_in_epoch / max(len(self.sampler), 1)
        self.log.scalars("train", values, self.state.step)
        self.log.line(f"step {self.state.step} | " + format_values(values))

    def _limit_reached(self) -> str | None:
        t, s = self.config.train, self.state
        if t.max_steps and s.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and s.epoch >= t.max_epochs:
            return "max_epochs"
        return None

    def _after_update(self) -> str | None:
        """Evaluate on schedule; agree across ranks on time/patience stops (rank 0 decides)."""
        t, s = self.config.train, self.state
        code = 0
        if s.step > 0 and s.step % t.eval_every == 0 and s.last_eval_step != s.step:
            self._evaluate_and_save()
            if t.patience and s.bad_evals >= t.patience:
                code = 2
        if self.budget and s.elapsed >= self.budget:
            code = code or 1
        if self.info.world_size > 1:
            code = int(broadcast(torch.tensor([code], device=self.device)).item())
        return STOP_CODES.get(code)

    # ----------------------------------------------------------------- validation, checkpoints

    def _evaluate_and_save(self) -> None:
        s = self.state
        s.last_eval_step = s.step
        if not self.info.is_main:
            return
        result = self.validator.run(self.model)
        if result["bleu"] > s.best_bleu:
            s.best_bleu, s.best_step, s.bad_evals = result["bleu"], s.step, 0
            ckpt.save_best(self.ckpt_dir, self.model, self.config, s.step, result["bleu"])
        else:
            s.bad_evals += 1
        self.last_valid = result
        values = {k: result[k] for k in ("loss", "ppl", "bleu", "chrf")}
        self.log.scalars("valid", values, s.step)
        self.log.line(f"valid step {s.step} | {format_values(values)} | best bleu {s.best_bleu:.2f} @ {s.best_step}")
        for i, (src, hyp, ref) in enumerate(result["samples"]):
            self.log.line(f"  sample {i + 1}: src: {src}\n            hyp: {hyp}\n            ref: {ref}")
            self.log.text(f"samples/{i + 1}", f"src: {src}  \nhyp: {hyp}  \nref: {ref}", s.step)
        s.elapsed = self.elapsed0 + time.monotonic() - self.t0
        state = {**self.trainer.state_dict(), "world_size": self.info.world_size}
        ckpt.save_checkpoint(self.ckpt_dir, s.step, self.model, state, self.config, self.config.train.keep_last)

    def _summary(self, stop: str | None) -> dict:
        s, valid = self.state, getattr(self, "last_valid", {})
        latest = ckpt.latest_checkpoint(self.ckpt_dir)
        return {
            "steps": s.step,
            "epochs": round(s.epoch + s.batch_in_epoch / max(len(self.sampler), 1), 3),
            "best_bleu": s.best_bleu,
            "best_step": s.best_step,
            "valid_bleu": valid.get("bleu", s.best_bleu),
            "valid_loss": valid.get("loss", float("nan")),
            "tokens_per_s": self.tokens0 / max(self.train_s, 1e-9),
            "nonfinite": s.nonfinite_total,
            "stopped": stop or "",
            "checkpoint": str(latest) if latest else "",
        }


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

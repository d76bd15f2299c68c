"""Training: data stream, model, DDP, validation, checkpoints, stopping, resume.

``train(config, run_dir)`` opens ``<run>/bin``'s splits without loading them (``ParallelSplit``:
shards, a shard's lengths when batched, a batch's tokens read from the files), so the trainer's
memory does not grow with the corpus, builds the model, and loops over optimizer updates (see
``nmt.train.update``) until the first of ``max_steps`` / ``max_epochs`` / ``max_time`` /
early stopping (``patience`` evaluations without a validation BLEU gain; ``nmt.train.stopping``).
Every ``eval_every`` updates — and once at the end — it validates and checkpoints
(``nmt.train.validation.EvalHook``).

Re-running on a run directory with checkpoints resumes from the newest complete one
(``nmt.train.resume``) and continues exactly as if it had never stopped: same data position (the
epoch and its global batch index, the same on every rank and at any rank count), RNG
states, optimizer and schedule (bit-identical on one process; with several ranks only rank
0's RNG is saved, the other ranks are reseeded from (seed, rank, step)). ``max_time`` is a
budget of training-loop wall time — updates, validation and checkpoint writes — summed over
all resumed invocations (``nmt.train.stopping`` says exactly what counts).

The loop does not wait for the device between updates: `Trainer.update` reads nothing back,
and the loop takes the issued updates' results (`Trainer.sync`, one read-back) only where it needs their
values — every ``train.log_every`` updates, at evaluation and at a stop. On a GPU the next groups of
batches are built ahead in a background thread, in pinned memory (`BatchFeed`); on the CPU they are
built when used. Either way the same batches, and the same data position in each checkpoint.

The pieces, one seam each: `TrainData` (this rank's batches, tokenizers, validator), `BatchFeed` (the
batches of each update), `build_seeded` (the model), `build_trainer` (its trainer: shared rows, the
DDP wrap, guided alignment), `resume_checkpoint` (resume), `StoppingRules` (when to stop), `EvalHook`
(validation and checkpoints), `TrainLog` + `TrainProgress` (logging, MFU against the measured matmul
peak), `ResidentMemory` (the peaks of anonymous and file-backed memory, logged at the end); `_Run`
only wires them together and runs the loop.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt.batches.batching import Batch, Prefetcher, WindowSampler, collate, load_batch
from nmt.batches.concat import ConcatenatedPairs
from nmt.batches.copy_spans import CopiedPairs, CopySettings
from nmt.batches.subword_sampling import Resegmenter
from nmt.config import Config
from nmt.data.tokenizer import shared_pieces
from nmt.data.vocab import check_vocab_copied
from nmt.errors import NmtError
from nmt.hw.device import describe, resolve_device, set_threads, training_precision
from nmt.model.flops import train_flops, training_peak_flops
from nmt.model.shared_rows import SharedRowsEmbedding, share_rows
from nmt.model.wrappers import wrap
from nmt.run import weights as ckpt
from nmt.run.layout import RunDir
from nmt.train.alignment import copy_keys
from nmt.train.distributed import DistInfo, barrier, init_distributed, teardown
from nmt.train.memory import ResidentMemory
from nmt.train.progress import TrainLog, TrainProgress
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
    from nmt.run.stamps import clear_stamp

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
    (any module with ``forward(src, tgt_in) -> logits`` works; no MFU then), `on_step` sees every
    update, settled, in order, at the loop's read-back points."""
    device = resolve_device(config.train.device)
    info, device = init_distributed(device)
    try:
        return _Run(config, Path(run_dir), device, info, restart, build).loop(on_step)
    finally:
        teardown()


# --------------------------------------------------------------------------- data and model


class _Stream:
    """This rank's micro-batches in order, across epochs, from the data position in TrainState:
    (epoch, batch_in_epoch = g, the epoch's global batch index, the same on every rank;
    `nmt.batches.batching.WindowSampler.take`)."""

    def __init__(self, sampler: WindowSampler) -> None:
        self.sampler = sampler

    def take(self, state: TrainState, k: int) -> list[np.ndarray]:
        """Up to k batches from the current epoch (a group never spans two epochs)."""
        if not self.sampler.rank_count(state.batch_in_epoch):  # nothing left for the ranks (a resume)
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        group, state.batch_in_epoch = self.sampler.take(state.epoch, state.batch_in_epoch, k)
        if not self.sampler.rank_count(state.batch_in_epoch):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        return group


PREFETCH_DEVICES = ("cuda",)  # device types whose batches are built ahead (tests add "cpu")
PREFETCH_DEPTH = 3  # groups of micro-batches built ahead at most


class BatchFeed:
    """This rank's groups of ``update_freq`` micro-batches, in order, from the position in TrainState.

    By default `next` reads and collates the group it hands out. On a device in `PREFETCH_DEVICES`
    a `Prefetcher` thread builds the next groups from its own copy of the position (pinned on
    CUDA, so that their copies to the GPU do not wait); TrainState's position advances only as
    groups are handed out, so a checkpoint saves the position of the batches trained on, never of
    those built ahead. Both hand out the same batches."""

    def __init__(self, data: TrainData, k: int, state: TrainState, device: torch.device) -> None:
        self.load, self.k, self.stream = _loader(data), k, _Stream(data.sampler)
        self.ahead: Prefetcher | None = None
        if device.type in PREFETCH_DEVICES:
            cursor = TrainState(epoch=state.epoch, batch_in_epoch=state.batch_in_epoch)
            groups = _groups(_Stream(data.sampler), self.load, cursor, k, pin=device.type == "cuda")
            self.ahead = Prefetcher(groups, PREFETCH_DEPTH)

    def next(self, state: TrainState) -> list[Batch]:
        """The next group's batches; advances `state`'s data position past them."""
        epoch = state.epoch
        group = self.stream.take(state, self.k)
        if self.ahead is None:
            return [self.load(idx, epoch) for idx in group]
        built, batches = next(self.ahead)
        if len(built) != len(group) or not all(np.array_equal(a, b) for a, b in zip(built, group, strict=True)):
            raise RuntimeError("prefetched batches out of step with the data position")
        return batches

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()


def _loader(data: TrainData) -> Callable[[np.ndarray, int], Batch]:
    """load(indices, epoch): one training batch, its pairs resampled into pieces where
    ``train.subword_alpha`` is on (`TrainData.subwords`, seeded by epoch and pair)."""
    dataset, subwords = data.dataset, data.subwords
    if subwords is None:
        return lambda idx, epoch: load_batch(dataset, idx)
    return lambda idx, epoch: collate(subwords.resegment(idx, [dataset.pair(int(i)) for i in idx], epoch))


def _groups(
    stream: _Stream, load: Callable[[np.ndarray, int], Batch], cursor: TrainState, k: int, pin: bool
) -> Iterator[tuple[list[np.ndarray], list[Batch]]]:
    """Every group from `cursor` on, across epochs: its indices and batches (pinned with `pin`)."""
    while True:
        epoch = cursor.epoch
        group = stream.take(cursor, k)
        batches = [load(idx, epoch) for idx in group]
        yield group, [b.pin_memory() for b in batches] if pin else batches


@dataclass
class TrainData:
    """This rank's training batches, the run's tokenizers (None without a vocab) and, on rank 0, the validator."""

    dataset: Any  # ParallelSplit of "train"
    sampler: WindowSampler
    src_tok: Any
    tgt_tok: Any
    validator: Validator | None
    subwords: Resegmenter | None = None  # train.subword_alpha's resampling of the training pairs
    copies: int = 0  # copy examples among the training pairs (train.copy_spans)

    @classmethod
    def open(cls, config: Config, run_dir: Path, device: torch.device, info: DistInfo, precision: str) -> TrainData:
        """`precision`: training's, resolved (`nmt.hw.device.training_precision`), for the validator."""
        from nmt.data.encoded import ParallelSplit

        t, run = config.train, RunDir(run_dir)
        dataset = ParallelSplit.open(run_dir, "train", config)
        models = (run.vocab_model(config.data.src_lang), run.vocab_model(config.data.tgt_lang))
        copies = 0
        if t.copy_spans > 0:
            dataset = CopiedPairs(dataset, models, CopySettings(t.copy_spans, t.seed, config.data.src_lang, t.max_len))
            copies = dataset.copies
        if t.concat_pairs > 0:
            dataset = ConcatenatedPairs(dataset, t.concat_pairs, t.seed)
        sampler = WindowSampler(
            dataset, t.max_tokens, t.max_len, seed=t.seed, rank=info.rank, world_size=info.world_size
        )
        src_tok = tgt_tok = validator = None
        if run.vocab.is_dir():
            from nmt.data.tokenizer import load_tokenizers

            src_tok, tgt_tok = load_tokenizers(run_dir, config)
        if info.is_main:
            valid = ParallelSplit.open(run_dir, "valid", config)
            validator = Validator(config, run_dir, valid, device, tgt_tok, precision=precision)
        subwords = None
        if t.subword_alpha > 0:
            subwords = Resegmenter(*models, alpha=t.subword_alpha, seed=t.seed, max_len=t.max_len)
        return cls(dataset, sampler, src_tok, tgt_tok, validator, subwords, copies)

    def vocab_sizes(self, config: Config) -> tuple[int, int]:
        """(source, target) vocabulary sizes: the tokenizers', else the config's."""
        src = self.src_tok.vocab_size if self.src_tok else config.vocab.src_size
        return src, self.tgt_tok.vocab_size if self.tgt_tok else config.vocab.tgt_size

    def describe(self) -> str:
        s = self.sampler
        return (
            f"data: {s.kept} pairs in {s.total} batches ({len(s)} per rank per epoch, "
            f"{len(s.counts)} window(s)), "
            f"{s.skipped} skipped (> train.max_len), padding waste {s.padding_waste:.1%}"
            + (f"; {self.copies} of the pairs are copy examples (train.copy_spans)" if self.copies else "")
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


def share_piece_rows(model: nn.Module, data: TrainData) -> SharedRowsEmbedding:
    """``train.share_piece_embeddings``: the model's source rows of the pieces both vocabularies
    spell alike read from its target table (`nmt.model.shared_rows`); the `SharedRowsEmbedding`."""
    if data.src_tok is None or not all(hasattr(model, name) for name in ("src_embed", "tgt_embed")):
        raise NmtError("train.share_piece_embeddings: needs the run's vocabularies (nmt vocab) and a Transformer")
    return share_rows(model, torch.from_numpy(shared_pieces(data.src_tok, data.tgt_tok)))


def build_trainer(
    model: nn.Module, config: Config, data: TrainData, *, device: torch.device, precision: torch.dtype, world_size: int
) -> tuple[Trainer, SharedRowsEmbedding | None]:
    """The `Trainer` of `model` (unwrapped) as `nmt train` builds it: its shared piece rows
    (``train.share_piece_embeddings``, synced back into the source table after every optimizer
    step, so that checkpoints, EMA and exports see the whole table), the model wrapped for
    compilation and DDP, and the copy keys of ``train.guided_alignment``. Returns the trainer and
    the shared rows (None when off)."""
    t = config.train
    shared = share_piece_rows(model, data) if t.share_piece_embeddings else None
    wrapped = wrap(model, t.compile, world_size, device)
    keys = copy_keys(data.src_tok, data.tgt_tok) if t.guided_alignment and data.src_tok else None
    trainer = Trainer(wrapped, t, device, precision=precision, copy_keys=keys)
    if shared is not None:
        trainer.optimizer.register_step_post_hook(lambda *_: shared.sync())
    return trainer, shared


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
        self.precision = training_precision(device, t.precision)  # once per process, passed down
        set_threads(t.threads)
        self.ckpt_dir = RunDir(run_dir).checkpoints
        if restart and info.is_main:
            ckpt.clear_checkpoints(self.ckpt_dir)
            shutil.rmtree(RunDir(run_dir).tb, ignore_errors=True)
        barrier()  # no rank may look for checkpoints before rank 0 has cleared them
        self.data = TrainData.open(config, run_dir, device, info, self.precision)
        self.vocab = self.data.vocab_sizes(config)
        self.peak = 0.0  # matmul FLOP/s for MFU: the Transformer's, on rank 0 (which logs)
        if info.is_main and build is None:
            self.peak = training_peak_flops(device, self.precision)
        self.model = build_seeded(config, self.vocab, device, build)
        self.resumed = resume_checkpoint(self.model, self.ckpt_dir)
        if self.resumed.path is None and t.init_from:
            check_vocab_copied(config, run_dir)
            self.resumed.notes.append(init_weights(self.model, config))
        self.trainer, self.shared = build_trainer(
            self.model, config, self.data, device=device, precision=self.precision, world_size=info.world_size
        )
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
        self.memory = ResidentMemory()
        t = self.config.train
        with self.log:
            self._describe()
            per_epoch = self.data.sampler.total  # the data position counts every rank's batches
            self.progress = TrainProgress(self.log, t.log_every, per_epoch, self.peak)
            self.feed = BatchFeed(self.data, t.update_freq, self.state, self.device)
            try:
                stop = self._updates()
            finally:
                self.feed.close()
            self._settle()
            if self.state.last_eval_step != self.state.step or ckpt.latest_checkpoint(self.ckpt_dir) is None:
                self._evaluate()
            barrier()
            self.log.line(self.rules.describe(stop, self.state))
            if line := self.memory.describe():
                self.log.line(line)
        return self._summary(stop) if self.info.is_main else {}

    def _updates(self) -> str | None:
        """Updates, with evaluations when due, until a stopping rule fires; its name."""
        self.rules.start_clock(self.state)
        stop = self.rules.before_update(self.state)
        while stop is None:
            self._one_update()
            evaluated = self.evaluate.due(self.state.step, self.state.last_eval_step)
            if evaluated:
                self._evaluate()
            after = self.rules.after_update(self.state, evaluated, self.device, self.info.world_size)
            stop = self.rules.before_update(self.state) or after
        return stop

    def _evaluate(self) -> None:
        self.evaluate(self.model, self.trainer, lambda: self.rules.tick(self.state))

    def _one_update(self) -> None:
        """Issue one update; settle where the loop needs the step count settled (`_settle_due`)."""
        start = time.monotonic()
        batches = self.feed.next(self.state)
        self.trainer.update(batches, flops=self._flops(batches) if self.peak else 0.0)
        self.progress.add_time(time.monotonic() - start)
        self.progress.issued(self.state.step)
        if self._settle_due():
            self._settle()

    def _flops(self, batches: list[Batch]) -> float:
        """Analytic training FLOPs of this rank's batches (`train_flops`: real tokens, padded lengths)."""
        m, vocab = self.config.model, self.vocab[1]
        return sum(train_flops(m, *b.real_tokens, b.src.size(1), b.tgt_out.size(1), vocab) for b in batches)

    def _settle_due(self) -> bool:
        """A log, evaluation or stop point by the provisional step count (where the loop must know
        whether it holds: a skipped update takes the count back)."""
        s = self.state
        due = s.step % self.config.train.log_every == 0 or self.evaluate.due(s.step, s.last_eval_step)
        return due or self.rules.before_update(s) is not None

    def _settle(self) -> None:
        """Read the issued updates back (the wait for the device counts as update time), then
        report every update settled since the last time, in order."""
        start = time.monotonic()
        settled = self.trainer.sync()
        self.progress.add_time(time.monotonic() - start)
        self.memory.sample()
        for result in settled:
            if self.on_step is not None:
                self.on_step(result)
            self.progress.record(result, self.state)

    def _describe(self) -> None:
        for note in self.resumed.notes:
            self.log.line(note)
        self.log.line(describe_model(self.model))
        if self.shared is not None:
            rows = len(self.shared.src_rows)
            self.log.line(f"train.share_piece_embeddings: {rows} source pieces read the target table's rows")
        where = describe(self.device, self.precision, self.config.train.precision)
        self.log.line(f"device: {where}, ranks {self.info.world_size}")
        if self.trainer.copy is not None:
            self.log.line("train.bf16_weight_copy: forward and backward on bf16 weights, fp32 master weights")
        if self.peak:
            peak = f"{self.peak / 1e12:.1f} TFLOP/s" if self.peak >= 1e12 else f"{self.peak / 1e9:.1f} GFLOP/s"
            self.log.line(f"matmul peak {peak} (measured once per host): mfu is against it")
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

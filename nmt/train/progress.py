"""Training output on the main rank: a rich progress bar, with every line and scalar also written
to the run log (`nmt.run.log.RunLogWriter`: ``<run>/train.log`` and TensorBoard), and what goes
into it (`TrainProgress`): the bar per update, a line for each skipped update, and every
``train.log_every`` updates the ``train/*`` scalars of the window since the last log line — loss,
perplexity, lr, gradient norm, target tokens/s and MFU over the window's update time (validation
and checkpoints excluded), padding waste, epoch.

On other ranks every method is a no-op.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from nmt.model.flops import mfu
from nmt.run.log import RunLogWriter, format_values
from nmt.train.update import StepResult, TrainState


class TrainLog:
    def __init__(self, run_dir: Path, enabled: bool, total_steps: int | None, start_step: int) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.writer: RunLogWriter | None = None
        self.progress: Progress | None = None
        if not enabled:
            return
        self.writer = RunLogWriter(run_dir)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, info="")

    def __enter__(self) -> TrainLog:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def line(self, text: str) -> None:
        """Print above the bar and append to train.log (with a timestamp)."""
        if self.writer is None:
            return
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.writer.line(text)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            self.writer.scalars(prefix, values, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            self.writer.text(tag, text, step)

    def advance(self, step: int, info: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.writer is not None:
            self.writer.close()


class TrainProgress:
    """What the loop reports, from settled updates (`nmt.train.update.Trainer.sync`).

    `add_time` takes the seconds the loop spent on updates (waiting for the device at a
    read-back included); `record` takes each settled update, in order. `peak` is the matmul FLOP/s MFU is
    measured against (0: no MFU)."""

    def __init__(self, log: TrainLog, log_every: int, batches_per_epoch: int, peak: float = 0.0) -> None:
        self.log, self.log_every, self.batches_per_epoch = log, log_every, max(batches_per_epoch, 1)
        self.peak = peak
        self.window, self.tokens, self.seconds = Window(), 0, 0.0
        self.info = ""

    @property
    def speed(self) -> float:
        """Target tokens per second of update time in this invocation (validation excluded)."""
        return self.tokens / max(self.seconds, 1e-9)

    def epochs(self, s: TrainState) -> float:
        return s.epoch + s.batch_in_epoch / self.batches_per_epoch

    def add_time(self, seconds: float) -> None:
        self.seconds += seconds
        self.window.seconds += seconds

    def issued(self, step: int) -> None:
        """Move the bar to `step` (the text changes when updates settle)."""
        self.log.advance(step, self.info)

    def record(self, result: StepResult, s: TrainState) -> None:
        """One settled update: a line if it was skipped, else into the window; the log line and
        scalars when it completes a multiple of ``log_every`` updates."""
        self.tokens += result.tokens
        if result.skipped:
            run = result.nonfinite_run
            self.log.line(f"step {result.step}: non-finite loss/gradient, update skipped ({run} in a row)")
            return
        self.window.add(result)
        self.info = f"loss {result.loss:.3f} lr {result.lr:.2e} {self.speed:,.0f} tok/s"
        self.log.advance(s.step, self.info)
        if result.step % self.log_every == 0:
            values, self.window = self.window.values(self.peak), Window()
            values["epoch"] = self.epochs(s)
            self.log.scalars("train", values, result.step)
            self.log.line(f"step {result.step} | " + format_values(values))


class Window:
    """Train statistics between two log lines; `seconds` is update time, added by the loop."""

    def __init__(self) -> None:
        self.seconds = self.loss = self.nll = self.norm = self.flops = self.lr = 0.0
        self.tokens = self.steps = self.pad = self.slots = self.copied = 0
        self.align = 0.0

    def add(self, r: StepResult) -> None:
        self.loss += r.loss * r.tokens
        self.nll += r.nll * r.tokens
        self.tokens += r.tokens
        self.norm += r.grad_norm
        self.flops += r.flops
        self.steps += 1
        self.pad, self.slots, self.lr = self.pad + r.pad, self.slots + r.slots, r.lr
        self.align, self.copied = self.align + r.align * r.copied, self.copied + r.copied

    def values(self, peak: float = 0.0) -> dict[str, Any]:
        """The window's scalars; ``mfu`` (a fraction of `peak`) where a peak and FLOPs are known."""
        n = max(self.tokens, 1)
        seconds = max(self.seconds, 1e-9)
        values = {
            "loss": self.loss / n,
            "ppl": float(np.exp(min(self.nll / n, 50.0))),
            "lr": self.lr,
            "grad_norm": self.norm / max(self.steps, 1),
            "tokens_per_s": self.tokens / seconds,
        }
        if peak > 0 and self.flops > 0:
            values["mfu"] = mfu(self.flops, seconds, peak)
        values["padding_waste"] = self.pad / max(self.slots, 1)
        if self.copied:  # train.guided_alignment: its loss per copied piece
            values["align"] = self.align / self.copied
        return values

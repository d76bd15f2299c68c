"""Training output on the main rank: a rich progress bar, with every line and scalar also written
to the run log (`nmt.runlog.RunLogWriter`: ``<run>/train.log`` and TensorBoard).

On other ranks every method is a no-op.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from nmt.runlog import RunLogWriter


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

"""Training output: a rich progress bar, ``<run>/train.log`` lines and TensorBoard scalars.

Only the main rank logs; on other ranks every method is a no-op.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainLog:
    def __init__(self, run_dir: Path, enabled: bool, total_steps: int | None, start_step: int) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "train.log"
        self.console = Console(stderr=True)
        self.writer = None
        self.progress: Progress | None = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))
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
        if not self.enabled:
            return
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{stamp} {text}\n")

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text, step)

    def advance(self, step: int, info: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def format_values(values: dict[str, float]) -> str:
    """'loss 3.2140 | ppl 24.88 | lr 5.000e-04' (4 significant figures, lr in scientific notation)."""
    parts = []
    for k, v in values.items():
        if isinstance(v, int):
            parts.append(f"{k} {v}")
        elif k == "lr":
            parts.append(f"{k} {v:.3e}")
        else:
            parts.append(f"{k} {v:.4g}" if abs(v) >= 1000 else f"{k} {v:.4f}")
    return " | ".join(parts)

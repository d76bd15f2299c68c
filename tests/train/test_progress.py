"""What the training log reports from settled updates (nmt/train/progress.py): the window's
scalars and line, MFU among them."""

from __future__ import annotations

import dataclasses

import pytest

from nmt.run.log import format_values
from nmt.train.progress import TrainProgress, Window
from nmt.train.update import StepResult, TrainState


class FakeLog:
    """`TrainLog`'s interface, recording."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.scalars_by_step: dict[int, dict[str, float]] = {}

    def line(self, text: str) -> None:
        self.lines.append(text)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        self.scalars_by_step[step] = {f"{prefix}/{k}": v for k, v in values.items()}

    def advance(self, step: int, info: str) -> None:
        pass


def settled(step: int, tokens: int = 100, flops: float = 1e9, skipped: bool = False) -> StepResult:
    return StepResult(step, 1e-3, 2.0, 1.5, tokens, 0.5, skipped, int(skipped), pad=10, slots=40, flops=flops)


def test_mfu_is_the_windows_flops_over_its_update_time_and_the_peak():
    log = FakeLog()
    progress = TrainProgress(log, log_every=2, batches_per_epoch=10, peak=4e9)
    state = TrainState(step=2)
    progress.add_time(0.5)  # updates 1 and 2 took a second of update time between them
    progress.record(settled(1), state)
    progress.add_time(0.5)
    progress.record(settled(2), state)
    scalars = log.scalars_by_step[2]
    assert scalars["train/mfu"] == pytest.approx(2e9 / 1.0 / 4e9)
    assert scalars["train/tokens_per_s"] == pytest.approx(200.0)
    assert "| tokens_per_s 200.0000 | mfu 50.0% |" in log.lines[-1] and log.lines[-1].startswith("step 2 |")


def test_a_skipped_update_gets_a_line_and_stays_out_of_the_window():
    log = FakeLog()
    progress = TrainProgress(log, log_every=1, batches_per_epoch=10, peak=1e9)
    progress.record(settled(3, skipped=True), TrainState(step=2))
    assert log.lines == ["step 3: non-finite loss/gradient, update skipped (1 in a row)"]
    assert progress.window.steps == 0 and progress.tokens == 100  # its tokens still count for speed


def test_no_mfu_without_a_peak_or_flops():
    window = Window()
    window.add(settled(1, flops=0.0))
    window.seconds = 1.0
    assert "mfu" not in window.values(peak=1e12)
    window.add(settled(2))
    assert "mfu" not in window.values(peak=0.0) and "mfu" in window.values(peak=1e12)


def test_mfu_prints_as_a_percentage():
    assert format_values({"tokens_per_s": 12345.6, "mfu": 0.4127}) == "tokens_per_s 1.235e+04 | mfu 41.3%"


def test_the_guided_alignment_loss_is_averaged_over_copied_pieces_and_shown_only_when_on():
    window = Window()
    base = settled(1)
    window.add(dataclasses.replace(base, align=2.0, copied=10))
    window.add(dataclasses.replace(base, align=0.5, copied=30))
    window.add(base)  # an update with nothing copied
    assert window.values()["align"] == pytest.approx((2.0 * 10 + 0.5 * 30) / 40)
    off = Window()
    off.add(base)
    assert "align" not in off.values()

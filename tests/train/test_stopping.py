"""When training stops (nmt/train/stopping.py): a config with no stopping rule is refused; step,
epoch, patience and time limits fire at the right state; max_time runs on the loop's clock (a fake
one here), summed over resumed invocations. The rules inside a real training run: test_train.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nmt.config import load_config
from nmt.errors import NmtError
from nmt.train import stopping
from nmt.train.stopping import StoppingRules, check_stopping
from nmt.train.update import TrainState

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
CPU = torch.device("cpu")


def rules(*overrides: str) -> StoppingRules:
    return StoppingRules(load_config(TINY, list(overrides)))


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The loop's clock, set by hand: `clock[0]` is what it reads (seconds)."""
    now = [1000.0]
    monkeypatch.setattr(stopping, "clock", lambda: now[0])
    return now


def test_no_stopping_rule_is_an_error():
    with pytest.raises(NmtError, match="stopping rule"):
        check_stopping(load_config(TINY, ["train.max_steps=0"]))
    assert check_stopping(load_config(TINY, ["train.max_time=2m"])) == 120.0


def test_step_and_epoch_limits_stop_before_the_next_update():
    limits = rules("train.max_steps=10", "train.max_epochs=2")
    assert limits.before_update(TrainState(step=9, epoch=1)) is None
    assert limits.before_update(TrainState(step=10, epoch=0)) == "max_steps"
    assert limits.before_update(TrainState(step=3, epoch=2)) == "max_epochs"
    assert rules("train.max_steps=0", "train.max_epochs=1").before_update(TrainState(step=10**6)) is None


def test_patience_fires_only_after_an_evaluation(clock):
    patient = rules("train.patience=2")
    assert patient.after_update(TrainState(bad_evals=2), evaluated=False, device=CPU, world_size=1) is None
    assert patient.after_update(TrainState(bad_evals=1), evaluated=True, device=CPU, world_size=1) is None
    assert patient.after_update(TrainState(bad_evals=2), evaluated=True, device=CPU, world_size=1) == "patience"


def test_max_time_is_loop_time_summed_over_resumed_invocations(clock):
    limits = rules("train.max_time=1m", "train.patience=1")
    clock[0] += 500.0  # start-up (data, model, checkpoint) before the first update does not count
    state = TrainState(step=7, elapsed=40.0)  # resumed: 40 s spent by an earlier invocation
    limits.start_clock(state)
    clock[0] += 19.5
    assert limits.after_update(state, evaluated=False, device=CPU, world_size=1) is None
    assert state.elapsed == pytest.approx(59.5)
    clock[0] += 0.5
    assert limits.after_update(state, evaluated=False, device=CPU, world_size=1) == "max_time"
    assert state.elapsed == pytest.approx(60.0)
    line = limits.describe("max_time", state)
    assert line.startswith("stopped: max_time at step 7 (60 s of training-loop wall time") and "max_time=1m" in line
    state.bad_evals = 1  # both rules fire: patience is the one named
    assert limits.after_update(state, evaluated=True, device=CPU, world_size=1) == "patience"

"""The budget schedules (`train.schedule: budget-linear | budget-cosine`): the learning rate
reaches `train.min_lr` as `train.max_time` runs out, and a resumed run continues the same curve."""

from __future__ import annotations

import math

import pytest
from toy_runs import Steps, toy_config, toy_run

from nmt.config import TrainConfig
from nmt.errors import ConfigError
from nmt.train import stopping
from nmt.train.loop import fit
from nmt.train.objective import decay_shape, lr_factor
from nmt.train.update import Trainer


def test_decay_shapes_run_from_one_to_zero():
    assert [decay_shape(p, "linear") for p in (0.0, 0.25, 1.0, 2.0)] == [1.0, 0.75, 0.0, 0.0]
    assert decay_shape(0.5, "cosine") == pytest.approx(0.5)
    assert decay_shape(0.25, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert decay_shape(-1.0, "cosine") == 1.0 and decay_shape(1.5, "cosine") == pytest.approx(0.0)


def test_budget_linear_warms_up_by_steps_then_decays_on_the_budget_spent():
    cfg = TrainConfig(lr=1e-3, warmup=10, schedule="budget-linear", max_time="100s", min_lr=1e-4)
    assert lr_factor(5, cfg, elapsed=3.0) == pytest.approx(0.5)  # warm-up: the clock does not matter
    # after warm-up, which ended at 20 s: 80 s left to go from 1 to the floor 0.1
    assert lr_factor(11, cfg, elapsed=20.0, warmup_elapsed=20.0) == pytest.approx(1.0)
    assert lr_factor(50, cfg, elapsed=60.0, warmup_elapsed=20.0) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(90, cfg, elapsed=100.0, warmup_elapsed=20.0) == pytest.approx(0.1)
    assert lr_factor(99, cfg, elapsed=130.0, warmup_elapsed=20.0) == pytest.approx(0.1)  # past the budget


def test_the_cosine_shape_is_shared_by_the_step_and_the_budget_schedules():
    steps = TrainConfig(warmup=10, schedule="cosine", max_steps=110)
    budget = TrainConfig(warmup=10, schedule="budget-cosine", max_time="100s")
    for done in (0, 13, 50, 77, 100):  # 1 update per second after warm-up: the same curve
        assert lr_factor(10 + done, budget, elapsed=float(done)) == pytest.approx(lr_factor(10 + done, steps))


def test_a_budget_schedule_without_max_time_is_a_one_line_error():
    with pytest.raises(ConfigError, match="train.schedule: budget-linear decays over the time budget") as e:
        toy_config("train.schedule=budget-linear", "train.max_steps=10")
    assert "\n" not in str(e.value)
    toy_config("train.schedule=budget-cosine", "train.max_time=20m")  # fine


def clocked(monkeypatch) -> None:
    """`nmt.train.stopping.clock` advanced 1 s by every update, by nothing else (no sleeping)."""
    now = [1000.0]
    monkeypatch.setattr(stopping, "clock", lambda: now[0])
    update = Trainer.update

    def timed(self, batches, **extra):
        now[0] += 1.0
        return update(self, batches, **extra)

    monkeypatch.setattr(Trainer, "update", timed)


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_the_rate_reaches_the_floor_at_the_budget_and_resumes_on_the_same_curve(tmp_path, monkeypatch, shape):
    clocked(monkeypatch)
    budget = ("train.lr=1e-3", "train.min_lr=1e-5", "train.max_time=20s", f"train.schedule=budget-{shape}")
    full = Steps()
    summary = fit(toy_config(*budget, "train.max_steps=100"), toy_run(tmp_path / "a"), on_step=full)
    assert summary["stopped"] == "max_time" and summary["steps"] == 20  # 1 s per update
    lrs = full.lrs
    assert lrs[3] == pytest.approx(1e-3)  # the warm-up's peak at update 4, then down to the floor
    assert all(a > b for a, b in zip(lrs[3:], lrs[4:], strict=False))
    assert lrs[-1] == pytest.approx(1e-5 + (1e-3 - 1e-5) * decay_shape(16 / 17, shape))  # 19 s used, 3 at warm-up
    first, second = Steps(), Steps()
    toy_run(tmp_path / "b")
    fit(toy_config(*budget, "train.max_steps=12"), tmp_path / "b", on_step=first)  # a checkpoint at 12
    resumed = fit(toy_config(*budget, "train.max_steps=100"), tmp_path / "b", on_step=second)
    assert resumed["steps"] == 20 and resumed["elapsed_s"] == summary["elapsed_s"]
    assert first.lrs + second.lrs == lrs  # exactly: the elapsed budget comes back from the checkpoint
    assert first.losses + second.losses == full.losses

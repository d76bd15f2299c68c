"""The moving average of the weights (`train.ema_decay`, `nmt.train.ema`): its arithmetic,
validation and checkpoints on the average, the raw weights kept for an exact resume."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from toy_runs import Steps, toy_config, toy_run

from nmt.run import weights as ckpt
from nmt.train.ema import WeightAverage
from nmt.train.loop import fit
from nmt.train.validation import Validator


def test_the_average_follows_the_weights_with_a_warmed_up_decay():
    layer = nn.Linear(3, 2)
    start = [p.detach().clone() for p in layer.parameters()]
    ema = WeightAverage(layer, decay=0.9)
    assert [ema.rate(t) for t in (1, 10, 100)] == [pytest.approx(2 / 11), pytest.approx(11 / 20), 0.9]
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(1.0)
    ema.update(1)  # avg = d·start + (1 - d)·(start + 1) with d = 2/11
    for a, s in zip(ema.average, start, strict=True):
        assert torch.allclose(a, s + 9 / 11)
    for t in range(2, 200):
        ema.update(t)
    for a, s in zip(ema.average, start, strict=True):  # the weights stood still: the average reaches them
        assert torch.allclose(a, s + 1.0, atol=1e-6)


def test_swapped_holds_the_average_inside_and_the_weights_exactly_after():
    layer = nn.Linear(3, 2)
    ema = WeightAverage(layer, decay=0.5)
    own = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        ema.average[0].fill_(7.0)
    with ema.swapped():
        assert (layer.weight == 7.0).all()
        assert torch.equal(ema.raw_weights()["weight"], own["weight"])  # the raw ones, not those in the model
    assert all(torch.equal(v, own[k]) for k, v in layer.state_dict().items())


def ema_config(steps: int):
    return toy_config("train.ema_decay=0.9", f"train.max_steps={steps}", "train.lr=3e-3")


def test_validation_and_checkpoints_use_the_average_and_keep_the_raw_weights(tmp_path, monkeypatch):
    validated = []
    run = Validator.run

    def spy(self, model):
        validated.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return run(self, model)

    monkeypatch.setattr(Validator, "run", spy)
    fit(ema_config(6), toy_run(tmp_path / "r"))
    d = tmp_path / "r" / "checkpoints"
    saved, _ = ckpt.load_weights(d / "step_6.safetensors")
    best, _ = ckpt.load_weights(d / "best.safetensors")
    raw = ckpt.load_trainer_state(d / "step_6.safetensors")["raw_weights"]
    assert len(validated) == 1  # at step 6, the stop
    assert all(torch.equal(saved[k], validated[0][k]) and torch.equal(best[k], saved[k]) for k in saved)
    moved = [k for k in saved if k.endswith("weight") and not torch.equal(saved[k], raw[k])]
    assert moved  # the checkpoint's weights are the average, not the weights being trained


def test_an_ema_run_resumes_exactly(tmp_path):
    full, first, second = Steps(), Steps(), Steps()
    fit(ema_config(12), toy_run(tmp_path / "a"), on_step=full)
    fit(ema_config(6), toy_run(tmp_path / "b"), on_step=first)
    fit(ema_config(12), tmp_path / "b", on_step=second)
    assert first.losses + second.losses == full.losses  # the raw weights came back, not the average
    for name in ("step_12.safetensors", "best.safetensors"):
        wa, _ = ckpt.load_weights(tmp_path / "a" / "checkpoints" / name)
        wb, _ = ckpt.load_weights(tmp_path / "b" / "checkpoints" / name)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)  # the average came back too

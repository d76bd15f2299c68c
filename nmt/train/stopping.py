"""When training stops: max_steps, max_epochs, max_time (the loop's wall clock) and patience.

`train.max_time` is a budget of *training-loop wall time*: the seconds from the first update
of an invocation to its last, counting everything the loop does — updates, the periodic
validation (loss + greedy BLEU) and the checkpoint writes — and summed over resumed
invocations (the total is `TrainState.elapsed`, saved in every checkpoint). Not counted:
start-up before the first update (opening the data, building the model, loading a
checkpoint), the final validation and checkpoint made after the stop, and the pipeline's
other stages. The budget is checked after every update, so a run stops at the first
update that ends past it, then validates and checkpoints once more. The budget schedules
(``train.schedule: budget-linear | budget-cosine``, `nmt.train.objective.lr_factor`) read the same
clock, so the learning rate reaches its floor when this rule stops the run.
"""

from __future__ import annotations

import time

import torch

from nmt.config import Config
from nmt.config_values import parse_duration
from nmt.errors import NmtError
from nmt.train.distributed import broadcast
from nmt.train.update import TrainState

STOP_CODES = {1: "max_time", 2: "patience"}
clock = time.monotonic  # the loop's wall clock (seconds); tests replace it with a fake one


def check_stopping(config: Config) -> float:
    """Seconds of the time budget (0 = none); NmtError when nothing would ever stop training."""
    t = config.train
    budget = parse_duration(t.max_time)
    if not (t.max_steps or t.max_epochs or budget or t.patience):
        raise NmtError("train: no stopping rule: set train.max_steps, max_epochs, max_time or patience")
    return budget


class StoppingRules:
    """The stopping rules of one invocation, and the clock that `train.max_time` is measured on."""

    def __init__(self, config: Config) -> None:
        self.train = config.train
        self.budget = check_stopping(config)  # seconds, 0 = no limit
        self._t0, self._elapsed0 = clock(), 0.0

    def start_clock(self, state: TrainState) -> None:
        """Start this invocation's share of the budget (on top of the resumed `state.elapsed`)."""
        self._t0, self._elapsed0 = clock(), state.elapsed

    def tick(self, state: TrainState) -> None:
        """Bring `state.elapsed` (loop wall seconds over all invocations) up to now."""
        state.elapsed = self._elapsed0 + clock() - self._t0

    def before_update(self, state: TrainState) -> str | None:
        """'max_steps' / 'max_epochs' when that limit is reached (the same on every rank)."""
        t = self.train
        if t.max_steps and state.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and state.epoch >= t.max_epochs:
            return "max_epochs"
        return None

    def after_update(self, state: TrainState, evaluated: bool, device: torch.device, world_size: int) -> str | None:
        """'patience' (after an evaluation without a BLEU gain) or 'max_time'; rank 0 decides for all."""
        self.tick(state)
        code = 0
        if evaluated and self.train.patience and state.bad_evals >= self.train.patience:
            code = 2
        if self.budget and state.elapsed >= self.budget:
            code = code or 1
        if world_size > 1:
            code = int(broadcast(torch.tensor([code], device=device)).item())
        return STOP_CODES.get(code)

    def describe(self, reason: str | None, state: TrainState) -> str:
        """The train.log line for the stop, naming the clock for max_time."""
        text = f"stopped: {reason} at step {state.step}"
        if reason == "max_time":
            text += (
                f" ({state.elapsed:.0f} s of training-loop wall time, validation and checkpoints included;"
                f" train.max_time={self.train.max_time})"
            )
        return text

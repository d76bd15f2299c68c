"""Resuming training: the newest readable checkpoint into the model, and what changed since.

`resume_checkpoint` walks the complete step checkpoints newest first and loads the first
whose weights and trainer state both read back (a half-written newest one is skipped with a
note); a checkpoint of a different architecture is a one-line `NmtError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from nmt import checkpoint as ckpt
from nmt.errors import NmtError
from nmt.train.update import TrainState


@dataclass
class Resumed:
    path: Path | None  # the step checkpoint loaded, None = fresh start
    state: dict | None  # its trainer state (Trainer.load_state_dict input)
    notes: list[str] = field(default_factory=list)  # lines for train.log (skipped checkpoints)


def resume_checkpoint(model: nn.Module, ckpt_dir: Path) -> Resumed:
    """Load the newest checkpoint whose files read back completely into `model`; skip broken ones."""
    notes: list[str] = []
    for weights in ckpt.complete_checkpoints(ckpt_dir):
        try:
            tensors, _ = ckpt.load_weights(weights)
            state = ckpt.load_trainer_state(weights)
        except (NmtError, RuntimeError, OSError, EOFError, ValueError) as e:
            notes.append(f"skipping unreadable checkpoint {weights.name}: {e}")
            continue
        try:
            model.load_state_dict(tensors)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[-1].strip()
            raise NmtError(f"{weights}: does not fit the configured model ({first}); use --restart") from None
        return Resumed(weights, state, notes)
    return Resumed(None, None, notes)


def reshard(state: TrainState, saved_world_size: int, world_size: int) -> str | None:
    """A different rank count reshards the data: continue from the start of the next epoch.

    Returns the train.log note, or None when nothing changed."""
    if saved_world_size == world_size or not state.batch_in_epoch:
        return None
    state.epoch += 1
    state.batch_in_epoch = 0
    return f"resuming on {world_size} ranks (saved with {saved_world_size}): data restarts at the next epoch"

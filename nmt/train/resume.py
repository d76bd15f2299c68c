"""Where training starts: the newest readable checkpoint of the run (resume), or, for a new run,
another run's trained model (`train.init_from`, fine-tuning), and what changed since.

`reshard` says what a new rank count changes (the data position stays).

`resume_checkpoint` walks the complete step checkpoints newest first and loads the first
whose weights and trainer state both read back (a half-written newest one is skipped with a
note); a checkpoint of a different architecture is a one-line `NmtError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from nmt.config import Config
from nmt.errors import NmtError
from nmt.run import weights as ckpt
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
    """A different rank count shares the rest of the epoch out anew; the data position is kept.

    The position (epoch, batch_in_epoch = g, the epoch's global batch index) means the same at any
    rank count (`nmt.batches.batching.WindowSampler.take`): the resumed ranks take batches g, g + 1, ...
    between them, exactly those the saved ranks had not. Returns the train.log note, or None when
    the rank count is unchanged."""
    if saved_world_size == world_size:
        return None
    return (
        f"resuming on {world_size} ranks (saved with {saved_world_size}): "
        f"the data continues at batch {state.batch_in_epoch} of epoch {state.epoch}"
    )


# --------------------------------------------------------------------------- fine-tuning


def init_weights(model: nn.Module, config: Config) -> str:
    """`train.init_from`'s weights into `model` (a new run, step 0); the train.log note. NmtError
    (one line) for a checkpoint of the other direction, of another shape, or whose run's
    vocabularies are not this run's."""
    tensors, stored, path = _init_checkpoint(config)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise NmtError(f"train.init_from: {path} does not fit this run's model ({first})") from None
    return f"initialised from {path} (its weights; optimizer, schedule and step count start fresh)"


def check_init(config: Config) -> None:
    """`train.init_from` checked before any work: it exists, translates this run's direction and
    has this run's model shape (NmtError, one line)."""
    _init_checkpoint(config)


def _init_checkpoint(config: Config) -> tuple[dict, Config, Path]:
    path = Path(config.train.init_from)
    if not path.is_file():
        raise NmtError(f"train.init_from: {path}: checkpoint not found")
    tensors, stored = ckpt.load_weights(path)
    check_init_source(stored, config, path)
    return tensors, stored, path


_SHAPE_FREE = (
    "dropout",
    "attention",
    "attention_dropout",
    "activation_dropout",
)  # settings that do not change the weights


def check_init_source(stored: Config, config: Config, path: Path) -> None:
    """NmtError naming the first difference that makes `path`'s model unusable as this run's start."""
    theirs, ours = (stored.data.src_lang, stored.data.tgt_lang), (config.data.src_lang, config.data.tgt_lang)
    if theirs != ours:
        raise NmtError(
            f"train.init_from: {path} translates {'→'.join(theirs)}, this run {'→'.join(ours)} (the other direction)"
        )
    for name in (f.name for f in dataclasses.fields(stored.model)):
        a, b = getattr(stored.model, name), getattr(config.model, name)
        if name not in _SHAPE_FREE and a != b:
            raise NmtError(f"train.init_from: {path} has model.{name}={a}, this run's config {b}")

"""A run's weights with PyTorch: safetensors weights + trainer state, written atomically;
loading; averaging (the layout and the rule of which checkpoint loads: `nmt.run`).

A step checkpoint is two files in ``<run>/checkpoints/``:

- ``step_<N>.state.pt``: trainer state (optimizer, scaler, counters, data position, RNG
  states), ``torch.save`` of plain tensors/ints/floats/lists, loadable with
  ``weights_only=True``; written first;
- ``step_<N>.safetensors``: fp32 weights with metadata ``{"config": <resolved yaml>,
  "step": "N"}``; written last, so its presence (with a state file next to it) marks a
  complete checkpoint.

Tensors that share storage (tied embeddings) are saved as separate copies because
safetensors refuses shared tensors; ``model.load_state_dict`` copies into the tied
parameter, so the tie survives a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from nmt.config import Config, config_to_yaml
from nmt.errors import NmtError
from nmt.files import atomic_path
from nmt.model.wrappers import unwrap
from nmt.run.checkpoints import (
    STATE_RE,
    STEP_RE,
    checkpoint_step,
    complete_checkpoints,
    latest_checkpoint,
    read_config,
    read_metadata,
    state_path,
    step_checkpoints,
)
from nmt.run.layout import BEST, FINAL, RunDir


def _plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in unwrap(model).state_dict().items():
        t = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype)
        key = t.untyped_storage().data_ptr()
        if key in seen or not t.is_contiguous():
            t = t.clone().contiguous()
        seen.add(key)
        out[name] = t
    return out


def save_weights(path: Path, tensors: dict[str, torch.Tensor], config: Config, step: int, **meta: str) -> Path:
    """Write a safetensors file atomically with the config and step in its metadata."""
    metadata = {"config": config_to_yaml(config), "step": str(step), **meta}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


def save_checkpoint(
    ckpt_dir: Path, step: int, model: nn.Module, trainer_state: dict, config: Config, keep_last: int
) -> Path:
    """Write step_<N>.state.pt then step_<N>.safetensors; prune to the newest `keep_last`."""
    ckpt_dir = Path(ckpt_dir)
    weights = ckpt_dir / f"step_{step}.safetensors"
    with atomic_path(state_path(weights)) as tmp:
        torch.save(trainer_state, tmp)
    save_weights(weights, _plain_state_dict(model), config, step)
    prune(ckpt_dir, keep_last)
    return weights


def save_best(ckpt_dir: Path, model: nn.Module, config: Config, step: int, bleu: float) -> Path:
    return save_weights(Path(ckpt_dir) / BEST, _plain_state_dict(model), config, step, bleu=f"{bleu:.4f}")


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints, and orphan older state files."""
    steps = step_checkpoints(ckpt_dir)
    for _, weights in steps[:-keep_last]:
        for p in (weights, state_path(weights)):  # weights first: a lone state is never "complete"
            p.unlink(missing_ok=True)
    if not steps:
        return
    for p in Path(ckpt_dir).glob("step_*.state.pt"):
        m = STATE_RE.match(p.name)
        if m and int(m.group(1)) < steps[-1][0] and not p.with_name(f"step_{m.group(1)}.safetensors").exists():
            p.unlink(missing_ok=True)


def clear_checkpoints(ckpt_dir: Path) -> None:
    """Remove every checkpoint file (for `restart`)."""
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.is_dir():
        for p in ckpt_dir.iterdir():
            if p.is_file() and (p.suffix in (".safetensors", ".pt") or p.name.endswith(".tmp")):
                p.unlink()


def write_final(ckpt_dir: Path, chosen: Path, name: str) -> Path:
    """Copy `chosen` to ``final.safetensors`` (atomically), recording what it was and the newest
    training step it was chosen after (``trained_to``; see `choose_inference_checkpoint`)."""
    newest = latest_checkpoint(ckpt_dir)
    trained_to = int(STEP_RE.match(newest.name).group(1)) if newest else checkpoint_step(chosen)
    meta = read_metadata(chosen)
    meta.update(selected=name, trained_to=str(trained_to))
    with atomic_path(Path(ckpt_dir) / FINAL) as tmp:
        save_file(load_file(str(chosen)), str(tmp), metadata=meta)
    return Path(ckpt_dir) / FINAL


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], Config]:
    """State dict and the config stored in the checkpoint's metadata."""
    config = read_config(path)
    return load_file(str(path)), config


def load_trainer_state(weights: Path) -> dict:
    """The trainer state saved next to `weights` (weights_only: no arbitrary code)."""
    path = state_path(weights)
    if not path.is_file():
        raise NmtError(f"{path}: trainer state missing")
    return torch.load(path, map_location="cpu", weights_only=True)


def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Element-wise fp32 mean of the weights; config and step of the last path."""
    if not paths:
        raise NmtError("average_checkpoints: no checkpoints given")
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        tensors, config = load_weights(p)
        if total and tensors.keys() != total.keys():
            raise NmtError(f"{p}: parameters differ from {paths[0]} (different models cannot be averaged)")
        for k, t in tensors.items():
            t = t.float() if t.is_floating_point() else t
            if k not in total:
                total[k] = t.clone()
            elif t.is_floating_point():
                total[k] += t
    averaged = {k: (t / len(paths) if t.is_floating_point() else t) for k, t in total.items()}
    names = ",".join(Path(p).name for p in paths)
    return save_weights(Path(out), averaged, config, checkpoint_step(paths[-1]), averaged=names)


@dataclass
class Averaged:
    """What `average_last` wrote: the file, the steps it averaged, and how many were asked for."""

    path: Path
    steps: list[int]  # oldest first
    requested: int

    def message(self) -> str:
        """One line for the user; says so when fewer checkpoints were kept than requested."""
        steps = ", ".join(map(str, self.steps))
        text = f"averaged {len(self.steps)} checkpoint(s) (steps {steps}) into {self.path}"
        if len(self.steps) < self.requested:
            text += f"; --last {self.requested} asked for {self.requested}, but the run keeps only {len(self.steps)}"
        return text


def average_last(run_dir: Path, last: int, out: Path | None = None) -> Averaged:
    """Average the newest `last` complete step checkpoints of a run (default out:
    ``checkpoints/averaged.safetensors``). Fewer kept than `last`: averages those, and the
    result's `message()` says how many."""
    run = RunDir(run_dir)
    ckpt_dir = run.checkpoints
    newest = list(reversed(complete_checkpoints(ckpt_dir)[:last]))  # oldest first
    if not newest:
        raise NmtError(f"{ckpt_dir}: no step checkpoints to average (train first: nmt train)")
    path = average_checkpoints(newest, Path(out) if out else run.averaged)
    return Averaged(path, [int(STEP_RE.match(p.name).group(1)) for p in newest], last)

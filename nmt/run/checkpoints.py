"""A run's checkpoint files without PyTorch: which exist and are complete, which one a command
loads (`choose_inference_checkpoint`), and what their headers say (step, stored config).

Reading the safetensors header directly keeps `nmt translate --engine ctranslate2` free of the
PyTorch import (seconds of start-up); `nmt.run.weights` writes, loads and averages the weights.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from nmt.config import YAML_LOADER, Config, config_from_dict
from nmt.errors import ConfigError, NmtError
from nmt.run.layout import BEST, FINAL, RunDir

STEP_RE = re.compile(r"^step_(\d+)\.safetensors$")
STATE_RE = re.compile(r"^step_(\d+)\.state\.pt$")
MAX_HEADER = 100_000_000  # the safetensors format's own limit on the JSON header (bytes)


def state_path(weights: Path) -> Path:
    """step_<N>.safetensors → step_<N>.state.pt"""
    weights = Path(weights)
    return weights.with_name(weights.name.removesuffix(".safetensors") + ".state.pt")


def step_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """All step_<N>.safetensors files, oldest first (complete or not)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_RE.match(p.name))]
    return sorted(found)


def is_complete(weights: Path) -> bool:
    """Weights with a readable header and a non-empty state file next to them."""
    state = state_path(weights)
    if not state.is_file() or state.stat().st_size == 0:
        return False
    try:
        return "step" in _header_metadata(weights)
    except (OSError, ValueError):  # any unreadable header means incomplete
        return False


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete step checkpoints, newest first."""
    return [p for _, p in reversed(step_checkpoints(ckpt_dir)) if is_complete(p)]


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """Newest complete step_<N>.safetensors, or None."""
    found = complete_checkpoints(ckpt_dir)
    return found[0] if found else None


def model_files(ckpt_dir: Path) -> list[Path]:
    """The files `choose_inference_checkpoint` picks from: final, best, complete step checkpoints."""
    named = [Path(ckpt_dir) / n for n in (FINAL, BEST)]
    return [p for p in named if p.is_file()] + complete_checkpoints(ckpt_dir)


@dataclass
class Choice:
    """The checkpoint a command loads when none is named, and why (for its "loaded ..." line)."""

    path: Path
    reason: str


def choose_inference_checkpoint(run_dir: Path) -> Choice:
    """THE rule for the model that translate / eval / serve load when no checkpoint is named.

    1. ``final.safetensors`` — the pipeline's choice on validation (averaged or best) — but
       only if it was selected from the run's newest training: its metadata ``trained_to``
       must equal the step of the newest complete step checkpoint. After ``nmt train`` goes
       on training, final is stale and skipped (the reason says so). A final written before
       ``trained_to`` existed counts as current if its step is the newest step or best's step.
    2. ``best.safetensors`` — best validation BLEU; every training run (re)writes it, so it
       always belongs to the run's newest training.
    3. the newest complete ``step_<N>.safetensors``.
    """
    run = RunDir(run_dir)
    ckpt_dir, final, best = run.checkpoints, run.final, run.best
    newest = latest_checkpoint(ckpt_dir)
    newest_step = int(STEP_RE.match(newest.name).group(1)) if newest else None
    stale = ""
    if final.is_file():
        trained_to = _final_trained_to(final, newest_step, best)
        if newest_step is None or trained_to == newest_step:
            return Choice(final, f"final: chosen on validation after training step {trained_to}")
        stale = f"; final.safetensors is stale (chosen after step {trained_to}, training reached step {newest_step})"
    if best.is_file():
        return Choice(best, f"best validation BLEU{stale}")
    if newest is None:
        raise NmtError(f"{ckpt_dir}: no checkpoint found (train first: nmt train)")
    return Choice(newest, f"newest step checkpoint{stale}")


def _final_trained_to(final: Path, newest_step: int | None, best: Path) -> int | None:
    """The training step `final` was selected after (legacy files: inferred from its step)."""
    meta = read_metadata(final)
    if "trained_to" in meta:
        return int(meta["trained_to"])
    step = int(meta.get("step", "-1"))
    if step == newest_step or (best.is_file() and checkpoint_step(best) == step):
        return newest_step
    return step


def find_inference_checkpoint(run_dir: Path) -> Path:
    """The path `choose_inference_checkpoint` picks."""
    return choose_inference_checkpoint(run_dir).path


def describe_checkpoint(path: Path, reason: str) -> str:
    """'loaded runs/x/checkpoints/best.safetensors (step 200; best validation BLEU)'."""
    return f"loaded {path} (step {read_metadata(path).get('step', '?')}; {reason})"


def read_metadata(path: Path) -> dict[str, str]:
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: checkpoint not found")
    try:
        return _header_metadata(path)
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: not a readable safetensors checkpoint ({e})") from None


def read_config(path: Path) -> Config:
    """The resolved config stored in a checkpoint's metadata (the weights are not read)."""
    meta = read_metadata(path)
    if "config" not in meta:
        raise NmtError(f"{path}: checkpoint has no config in its metadata (not written by nmt)")
    try:
        return config_from_dict(yaml.load(meta["config"], Loader=YAML_LOADER) or {}, source=f"{path}:config")
    except (yaml.YAMLError, ConfigError) as e:
        raise NmtError(f"{path}: stored config is invalid ({e})") from None


def _header_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file: an 8-byte little-endian header length, then a
    JSON header (the format's definition); ValueError when the header is not one."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        if size > MAX_HEADER or size > os.fstat(f.fileno()).st_size - 8:
            raise ValueError(f"header length {size} does not fit the file")
        header = json.loads(f.read(size))
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise ValueError("header is not a mapping")
    return {str(k): str(v) for k, v in header.get("__metadata__", {}).items()}


def checkpoint_step(path: Path) -> int:
    return int(read_metadata(path).get("step", "0"))

"""Run directories, atomic file writes and stage stamps.

A run directory (`runs/<name>/`) holds everything one experiment made:

    config.yaml                resolved config
    corpus/{train,valid,test}.{zh,en}, corpus/stats.json, corpus/test.codes (optional)
    vocab/{zh,en}.model        SentencePiece models
    bin/{split}.{zh,en}.npy    int32 token ids, and {split}.{zh,en}.offsets.npy
    checkpoints/               step_<N>.safetensors + step_<N>.state.pt, best.safetensors
    tb/, train.log, eval/

`runs/latest` is a symlink to the newest run. Each stage writes a stamp
(`<stage>.stamp.json`) holding the hash of its inputs, so a finished stage is skipped and
a stale one is redone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from nmt.config import Config, ConfigError, config_to_yaml, load_config
from nmt.errors import NmtError
from nmt.files import atomic_path, atomic_write_json, atomic_write_text

RUNS_ROOT = Path("runs")


# --------------------------------------------------------------------------- run directories


def default_run_dir(config: Config) -> Path:
    return RUNS_ROOT / config.name


def resolve_run(config_path: str | None, run: str | None, overrides: list[str] | None = None) -> tuple[Config, Path]:
    """Find the config and the run directory a command works on.

    - `--config` given: load it (plus overrides); run dir is `--run` or `runs/<config name>`.
    - only `--run` given: read `<run>/config.yaml`.
    - neither: use `runs/latest`.
    """
    if config_path:
        config = load_config(config_path, overrides)
        run_dir = Path(run) if run else default_run_dir(config)
        return config, run_dir
    run_dir = Path(run) if run else RUNS_ROOT / "latest"
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        if run is None:
            raise NmtError("no --config given and runs/latest does not exist: pass --config FILE or --run DIR")
        raise NmtError(f"{saved}: not found: pass --config FILE, or --run a directory made by nmt")
    return load_config(saved, overrides), run_dir.resolve() if run is None else run_dir


def init_run(config: Config, run_dir: Path) -> Path:
    """Create the run directory, save the resolved config, point runs/latest at it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / "config.yaml"
    text = config_to_yaml(config)
    if not saved.exists() or saved.read_text(encoding="utf-8") != text:
        atomic_write_text(saved, text)
    mark_latest(run_dir)
    return run_dir


def mark_latest(run_dir: Path) -> None:
    """Point `<parent of run_dir>/latest` at run_dir (relative symlink, replaced atomically)."""
    run_dir = Path(run_dir).resolve()
    link = run_dir.parent / "latest"
    if run_dir.name == "latest":
        return
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(run_dir.name, tmp)
        os.replace(tmp, link)
    except OSError:  # filesystems without symlinks: not fatal
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# --------------------------------------------------------------------------- stage stamps


def hash_files(paths: list[Path], extra: Any = None) -> str:
    """SHA-256 over file contents (in order) and a JSON-able `extra` (e.g. config sections)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(str(Path(p).name).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()


def stamp_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f"{stage}.stamp.json"


def is_fresh(run_dir: Path, stage: str, digest: str) -> bool:
    """True when `stage` finished before with the same input digest."""
    p = stamp_path(run_dir, stage)
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("inputs") == digest
    except (OSError, json.JSONDecodeError):
        return False


def write_stamp(run_dir: Path, stage: str, digest: str, info: dict | None = None) -> None:
    atomic_write_json(stamp_path(run_dir, stage), {"inputs": digest, **(info or {})})


def clear_stamp(run_dir: Path, stage: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        stamp_path(run_dir, stage).unlink()


__all__ = [
    "ConfigError",
    "atomic_path",
    "atomic_write_json",
    "atomic_write_text",
    "clear_stamp",
    "default_run_dir",
    "hash_files",
    "init_run",
    "is_fresh",
    "mark_latest",
    "resolve_run",
    "write_stamp",
]

"""Stage stamps: each stage of a run writes `RunDir.stamp(stage)` (`<run>/<stage>.stamp.json`) holding the hash of its
inputs (`hash_files`), so that a finished stage is skipped (`stage_is_done`) and a stale one is
redone."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from nmt.files import atomic_write_json
from nmt.run.layout import RunDir


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


def stage_is_done(run_dir: Path, stage: str, digest: str) -> bool:
    """True when `stage` finished before with the same input digest."""
    p = RunDir(run_dir).stamp(stage)
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("inputs") == digest
    except (OSError, json.JSONDecodeError):
        return False


def write_stamp(run_dir: Path, stage: str, digest: str, info: dict | None = None) -> None:
    atomic_write_json(RunDir(run_dir).stamp(stage), {"inputs": digest, **(info or {})})


def clear_stamp(run_dir: Path, stage: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        RunDir(run_dir).stamp(stage).unlink()

import os
from pathlib import Path

import pytest

from nmt.config import load_config
from nmt.errors import NmtError
from nmt.runs import (
    atomic_path,
    atomic_write_text,
    hash_files,
    init_run,
    is_fresh,
    resolve_run,
    write_stamp,
)

ROOT = Path(__file__).resolve().parent.parent


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_init_run_saves_config_and_latest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, run_dir = resolve_run(str(ROOT / "configs" / "tiny.yaml"), None, ["train.lr=0.01"])
    assert run_dir == Path("runs/tiny")
    init_run(cfg, run_dir)
    saved = load_config(run_dir / "config.yaml")
    assert saved.train.lr == 0.01
    assert Path("runs/latest").resolve() == run_dir.resolve()
    # With no --config, commands read the latest run's saved config.
    again, where = resolve_run(None, None)
    assert again.train.lr == 0.01 and where.resolve() == run_dir.resolve()
    # --run alone reads that run's config.
    again, where = resolve_run(None, "runs/tiny")
    assert again.name == "tiny"


def test_resolve_run_without_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NmtError, match="runs/latest does not exist"):
        resolve_run(None, None)
    with pytest.raises(NmtError, match="elsewhere/config.yaml: not found"):
        resolve_run(None, "elsewhere")


def test_stamps_detect_changed_inputs(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one")
    digest = hash_files([f], {"k": 1})
    assert not is_fresh(tmp_path, "stage", digest)
    write_stamp(tmp_path, "stage", digest)
    assert is_fresh(tmp_path, "stage", digest)
    assert not is_fresh(tmp_path, "stage", hash_files([f], {"k": 2}))
    f.write_text("two")
    assert not is_fresh(tmp_path, "stage", hash_files([f], {"k": 1}))

import os
from pathlib import Path

import pytest

from nmt.config import load_config
from nmt.errors import NmtError
from nmt.files import atomic_path, atomic_write_text
from nmt.run.dirs import init_run, newest_model_run, resolve_run

ROOT = Path(__file__).resolve().parents[2]


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
    with pytest.raises(NmtError, match="no run with a trained model under runs/"):
        resolve_run(None, None, need_model=True)
    with pytest.raises(NmtError, match="elsewhere/config.yaml: not found"):
        resolve_run(None, "elsewhere")


def _model_run(root: Path, name: str, config, with_model: bool) -> Path:
    """A run dir under `root` with a saved config and, optionally, a (tiny) best checkpoint."""
    import torch

    from nmt.model.transformer import build_model
    from nmt.run.weights import save_best

    run_dir = init_run(config, root / name)
    if with_model:
        torch.manual_seed(0)
        save_best(run_dir / "checkpoints", build_model(config, 20, 20), config, 1, 0.0)
    return run_dir


def test_default_model_run_is_the_newest_run_with_a_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "configs" / "tiny.yaml")
    older = _model_run(Path("runs"), "older", config, with_model=True)
    newer = _model_run(Path("runs"), "newer", config, with_model=True)
    os.utime(older / "checkpoints" / "best.safetensors", (1, 1))  # older model files
    _model_run(Path("runs"), "bench-ref", config, with_model=False)  # newest dir, no model
    assert Path("runs/latest").resolve() == (tmp_path / "runs" / "bench-ref")
    assert newest_model_run() == newer.resolve()
    _, where = resolve_run(None, None, need_model=True)  # translate / eval / average / serve
    assert where == newer.resolve()
    _, where = resolve_run(None, None)  # stage commands: runs/latest
    assert where == (tmp_path / "runs" / "bench-ref")


def test_latest_is_only_kept_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "configs" / "tiny.yaml")
    init_run(config, Path("runs/mine"))
    init_run(config, tmp_path / "elsewhere" / "exp")  # --run outside runs/: no link anywhere
    assert not (tmp_path / "elsewhere" / "latest").exists()
    init_run(config, Path("runs/bench"), latest=False)  # benchmarks leave the user's default alone
    assert Path("runs/latest").resolve() == (tmp_path / "runs" / "mine")


def test_bench_train_does_not_move_latest(tmp_path, monkeypatch):
    import argparse
    import importlib.util

    import nmt.data.corpus
    import nmt.data.vocab

    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "scripts" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(nmt.data.corpus, "prepare_corpus", lambda *a, **k: None)  # data prep is not the point
    monkeypatch.setattr(nmt.data.vocab, "build_vocab", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    init_run(load_config(ROOT / "configs" / "tiny.yaml"), Path("runs/mine"))
    bench.prepare_data(argparse.Namespace(run=tmp_path / "runs" / "bench-ref", mirror=None))
    assert (tmp_path / "runs" / "bench-ref" / "config.yaml").is_file()
    assert Path("runs/latest").resolve() == (tmp_path / "runs" / "mine")

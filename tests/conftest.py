"""Shared fixtures: the real zh-en mirror, small configs, temporary run directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from nmt.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("NMT_TEST_MIRROR", ROOT.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "tatoeba-zh-en" / "train.jsonl").is_file():
        pytest.skip(f"real corpus mirror not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def tiny_config() -> Config:
    return load_config(ROOT / "configs" / "tiny.yaml")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mini_mirror(tmp_path_factory) -> Path:
    """A small mirror in the same schema: the first lines of each real Tatoeba split."""
    src = SHARED_DATA / "tatoeba-zh-en"
    if not (src / "train.jsonl").is_file():
        pytest.skip(f"real corpus mirror not found at {SHARED_DATA}")
    out = tmp_path_factory.mktemp("mirror") / "tatoeba-zh-en"
    out.mkdir()
    sizes = {"train.jsonl": 3000, "validation.jsonl": 200, "test.jsonl": 200, "test.codes.txt": 200}
    for name, n in sizes.items():
        with open(src / name, encoding="utf-8") as f:
            lines = [next(f) for _ in range(n)]
        (out / name).write_text("".join(lines), encoding="utf-8")
    return out.parent


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, mini_mirror) -> Path:
    """A finished `nmt pipeline` run of configs/tiny.yaml on the mini mirror (made once)."""
    from nmt.config import load_config
    from nmt.pipeline import run_pipeline
    from nmt.runs import init_run

    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    config = load_config(ROOT / "configs" / "tiny.yaml")
    init_run(config, run_dir)
    run_pipeline(config, run_dir, mirror=str(mini_mirror))
    return run_dir


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and the CI machine's cores are shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

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

"""The safetensors header reader of nmt.run.checkpoints (no PyTorch), against the real format."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from nmt.config import Config, config_to_yaml
from nmt.errors import NmtError
from nmt.run import checkpoints as cfiles


def test_metadata_and_config_read_as_safetensors_writes_them(tmp_path):
    path = tmp_path / "step_3.safetensors"
    config = Config()
    save_file({"w": torch.ones(2, 2)}, str(path), metadata={"config": config_to_yaml(config), "step": "3"})
    assert cfiles.read_metadata(path)["step"] == "3" and cfiles.checkpoint_step(path) == 3
    assert cfiles.read_config(path) == config
    (tmp_path / "step_3.state.pt").write_bytes(b"x")
    assert cfiles.is_complete(path)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x05\x00",
        (10**9).to_bytes(8, "little") + b"{}",
        (4).to_bytes(8, "little") + b"[1,2]",
        b"\x02" + b"\0" * 7 + b"{x",
    ],
)
def test_unreadable_headers_are_one_line_errors(tmp_path, content):
    path = tmp_path / "step_1.safetensors"
    path.write_bytes(content)
    with pytest.raises(NmtError, match=r"step_1\.safetensors: not a readable safetensors checkpoint"):
        cfiles.read_metadata(path)
    (tmp_path / "step_1.state.pt").write_bytes(b"x")
    assert not cfiles.is_complete(path)


def test_a_checkpoint_without_config_is_named(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(1)}, str(path), metadata={"step": "1"})
    with pytest.raises(NmtError, match=r"w\.safetensors: checkpoint has no config"):
        cfiles.read_config(path)
    with pytest.raises(NmtError, match="checkpoint not found"):
        cfiles.read_metadata(tmp_path / "missing.safetensors")

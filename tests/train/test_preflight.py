"""`nmt train` checks what the host must run before it prepares anything, then prepares what is missing."""

from __future__ import annotations

import pytest
from conftest import ROOT, TINY_LEARNS
from typer.testing import CliRunner

from nmt import pipeline
from nmt.cli import app
from nmt.config import load_config
from nmt.errors import ConfigError, NmtError
from nmt.train.preflight import check_host

TINY = ROOT / "configs" / "tiny.yaml"


@pytest.mark.parametrize(
    ("setting", "error", "message"),
    [
        ("model.attention=flash", ConfigError, "flash"),
        ("train.precision=fp16", NmtError, "fp16 needs a CUDA device"),
        ("train.device=cuda", NmtError, "CUDA is not available"),
    ],
)
def test_a_setting_the_host_cannot_run_is_refused(setting, error, message, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(error, match=message):
        check_host(load_config(TINY, [setting]))


def test_a_runnable_config_gives_the_device_it_trains_on():
    assert check_host(load_config(TINY)).type == "cpu"


def test_the_train_command_refuses_before_preparing_anything(tmp_path, mini_mirror, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    run = tmp_path / "run"
    args = ["train", "--config", str(TINY), "--set", "model.attention=flash", "--run", str(run)]
    result = CliRunner().invoke(app, [*args, "--mirror", str(mini_mirror)])
    assert result.exit_code == 1 and "flash" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (run / "corpus").exists() and not (run / "vocab").exists()


@pytest.mark.slow
def test_train_on_a_fresh_run_prepares_the_corpus_and_vocabularies_first(tmp_path, mini_mirror):
    run = tmp_path / "run"
    sets = [a for s in [*TINY_LEARNS, "train.max_steps=4", "train.eval_every=4"] for a in ("--set", s)]
    result = CliRunner().invoke(
        app, ["train", "--config", str(TINY), *sets, "--run", str(run), "--mirror", str(mini_mirror)]
    )
    assert result.exit_code == 0, result.output
    assert (run / "corpus" / "train.zh").is_file() and (run / "vocab" / "en.model").is_file()
    assert (run / "checkpoints" / "step_4.safetensors").is_file()
    stamps = {p.name: p.read_text() for p in run.glob("*.stamp.json")}
    again = CliRunner().invoke(
        app, ["train", "--config", str(TINY), *sets, "--run", str(run), "--mirror", str(mini_mirror)]
    )
    assert again.exit_code == 0, again.output
    assert {p.name: p.read_text() for p in run.glob("*.stamp.json") if p.name in stamps} == stamps  # nothing redone


def test_ranks_other_than_0_wait_for_rank_0_and_prepare_nothing(tmp_path, monkeypatch):
    """Under torchrun, rank 1 waits for the marker rank 0 touches when the data is ready (named
    after the launch's run id), then trains without preparing anything itself."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-7")
    marker = tmp_path / ".prepared-launch-7"
    (tmp_path / ".prepared-launch-6").touch()  # an earlier launch's marker does not count
    polls = []

    def sleep(_seconds):  # rank 0 finishes while rank 1 waits its second poll
        polls.append(1)
        if len(polls) == 2:
            marker.touch()

    monkeypatch.setattr(pipeline.time, "sleep", sleep)
    monkeypatch.setattr(pipeline, "prepare_data", lambda *a: pytest.fail("rank 1 prepared data"))
    monkeypatch.setattr("nmt.train.loop.train", lambda config, run_dir, restart: {"rank": 1})
    assert pipeline.prepare_and_train(load_config(TINY), tmp_path) == {"rank": 1}
    assert len(polls) == 2

from __future__ import annotations

import pytest
import torch

from nmt.config import config_to_yaml
from nmt.errors import NmtError
from nmt.model.transformer import build_model
from nmt.run import checkpoints as cfiles
from nmt.run import weights as ckpt
from nmt.train.update import Trainer


@pytest.fixture
def model(tiny_config):
    torch.manual_seed(0)
    return build_model(tiny_config, 50, 60)


def trainer_state(model, config) -> dict:
    trainer = Trainer(model, config.train, torch.device("cpu"), precision="fp32")
    return trainer.state_dict()


def test_round_trip_keeps_weights_config_and_tied_embeddings(tmp_path, model, tiny_config):
    assert tiny_config.model.tie_embeddings
    path = ckpt.save_checkpoint(tmp_path, 7, model, trainer_state(model, tiny_config), tiny_config, keep_last=3)
    assert path.name == "step_7.safetensors" and cfiles.state_path(path).is_file()
    tensors, config = ckpt.load_weights(path)
    assert config == tiny_config
    assert cfiles.read_metadata(path)["config"] == config_to_yaml(tiny_config)
    assert cfiles.checkpoint_step(path) == 7
    fresh = build_model(tiny_config, 50, 60)
    fresh.load_state_dict(tensors)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    shared = {p.data_ptr() for p in model.parameters()}
    assert len({p.data_ptr() for p in fresh.parameters()}) == len(shared)  # tie survives


def test_trainer_state_loads_with_weights_only(tmp_path, model, tiny_config):
    state = trainer_state(model, tiny_config)
    path = ckpt.save_checkpoint(tmp_path, 1, model, state, tiny_config, keep_last=1)
    loaded = ckpt.load_trainer_state(path)  # torch.load(weights_only=True) inside
    assert loaded["train"] == state["train"]
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    assert set(loaded) >= {"optimizer", "scaler", "scheduler", "train", "rng"}


def test_keep_last_prunes_old_steps(tmp_path, model, tiny_config):
    state = trainer_state(model, tiny_config)
    for step in (10, 20, 30, 40):
        ckpt.save_checkpoint(tmp_path, step, model, state, tiny_config, keep_last=2)
    assert [s for s, _ in cfiles.step_checkpoints(tmp_path)] == [30, 40]
    assert sorted(p.name for p in tmp_path.glob("*.state.pt")) == ["step_30.state.pt", "step_40.state.pt"]
    assert not list(tmp_path.glob("*.tmp"))


def test_latest_skips_incomplete_and_corrupt(tmp_path, model, tiny_config):
    state = trainer_state(model, tiny_config)
    ckpt.save_checkpoint(tmp_path, 10, model, state, tiny_config, keep_last=5)
    ckpt.save_checkpoint(tmp_path, 20, model, state, tiny_config, keep_last=5)
    ckpt.save_checkpoint(tmp_path, 30, model, state, tiny_config, keep_last=5)
    assert cfiles.latest_checkpoint(tmp_path).name == "step_30.safetensors"
    cfiles.state_path(tmp_path / "step_30.safetensors").unlink()  # weights without state
    assert cfiles.latest_checkpoint(tmp_path).name == "step_20.safetensors"
    (tmp_path / "step_20.safetensors").write_bytes(b"garbage")  # unreadable header
    assert cfiles.latest_checkpoint(tmp_path).name == "step_10.safetensors"
    assert cfiles.latest_checkpoint(tmp_path / "missing") is None


def test_find_inference_checkpoint_order(tmp_path, model, tiny_config):
    run = tmp_path / "run"
    with pytest.raises(NmtError, match="no checkpoint"):
        cfiles.find_inference_checkpoint(run)
    d = run / "checkpoints"
    ckpt.save_checkpoint(d, 5, model, trainer_state(model, tiny_config), tiny_config, keep_last=2)
    assert cfiles.find_inference_checkpoint(run).name == "step_5.safetensors"
    ckpt.save_best(d, model, tiny_config, 5, 12.5)
    assert cfiles.find_inference_checkpoint(run).name == "best.safetensors"
    (d / "final.safetensors").write_bytes((d / "best.safetensors").read_bytes())
    assert cfiles.find_inference_checkpoint(run).name == "final.safetensors"


def test_load_weights_errors(tmp_path):
    with pytest.raises(NmtError, match="not found"):
        ckpt.load_weights(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 20)
    with pytest.raises(NmtError, match="readable"):
        ckpt.load_weights(bad)


def test_average_of_identical_checkpoints_is_the_checkpoint(tmp_path, model, tiny_config):
    state = trainer_state(model, tiny_config)
    paths = [ckpt.save_checkpoint(tmp_path, s, model, state, tiny_config, keep_last=5) for s in (1, 2, 3)]
    out = ckpt.average_checkpoints(paths, tmp_path / "avg.safetensors")
    averaged, config = ckpt.load_weights(out)
    original, _ = ckpt.load_weights(paths[0])
    assert config == tiny_config and cfiles.checkpoint_step(out) == 3
    for k, v in original.items():
        torch.testing.assert_close(averaged[k], v, rtol=1e-6, atol=1e-7)


def test_average_last_is_the_mean(tmp_path, tiny_config):
    torch.manual_seed(1)
    a, b = build_model(tiny_config, 50, 60), build_model(tiny_config, 50, 60)
    state = trainer_state(a, tiny_config)
    d = tmp_path / "checkpoints"
    pa = ckpt.save_checkpoint(d, 1, a, state, tiny_config, keep_last=5)
    pb = ckpt.save_checkpoint(d, 2, b, state, tiny_config, keep_last=5)
    out = ckpt.average_last(tmp_path, 2).path
    assert out == d / "averaged.safetensors"
    averaged, _ = ckpt.load_weights(out)
    wa, wb = ckpt.load_weights(pa)[0], ckpt.load_weights(pb)[0]
    name = next(k for k, v in wa.items() if v.is_floating_point() and not torch.equal(v, wb[k]))
    torch.testing.assert_close(averaged[name], (wa[name] + wb[name]) / 2)


def test_clear_checkpoints(tmp_path, model, tiny_config):
    ckpt.save_checkpoint(tmp_path, 1, model, trainer_state(model, tiny_config), tiny_config, keep_last=5)
    ckpt.save_best(tmp_path, model, tiny_config, 1, 3.0)
    ckpt.clear_checkpoints(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_stale_final_is_not_used_after_training_goes_on(tmp_path, model, tiny_config):
    run, state = tmp_path / "run", trainer_state(model, tiny_config)
    d = run / "checkpoints"
    ckpt.save_checkpoint(d, 15, model, state, tiny_config, keep_last=2)
    ckpt.save_best(d, model, tiny_config, 10, 1.0)
    ckpt.write_final(d, d / "best.safetensors", "best")  # the pipeline's selection after step 15
    choice = cfiles.choose_inference_checkpoint(run)
    assert choice.path.name == "final.safetensors" and "after training step 15" in choice.reason
    assert cfiles.read_metadata(choice.path)["trained_to"] == "15"
    # `nmt train --set train.max_steps=200` goes on; best did not improve
    ckpt.save_checkpoint(d, 200, model, state, tiny_config, keep_last=2)
    choice = cfiles.choose_inference_checkpoint(run)
    assert choice.path.name == "best.safetensors"
    assert "stale" in choice.reason and "step 200" in choice.reason
    assert cfiles.find_inference_checkpoint(run) == choice.path
    (d / "best.safetensors").unlink()  # no best: the newest step checkpoint
    assert cfiles.choose_inference_checkpoint(run).path.name == "step_200.safetensors"
    ckpt.write_final(d, d / "step_200.safetensors", "averaged")  # selected again: current again
    assert cfiles.choose_inference_checkpoint(run).path.name == "final.safetensors"


def test_final_without_trained_to_is_judged_by_its_step(tmp_path, model, tiny_config):
    run, state = tmp_path / "run", trainer_state(model, tiny_config)
    d = run / "checkpoints"
    ckpt.save_checkpoint(d, 15, model, state, tiny_config, keep_last=2)
    ckpt.save_best(d, model, tiny_config, 15, 1.0)
    (d / "final.safetensors").write_bytes((d / "step_15.safetensors").read_bytes())  # an older pipeline's copy
    assert cfiles.find_inference_checkpoint(run).name == "final.safetensors"
    ckpt.save_checkpoint(d, 30, model, state, tiny_config, keep_last=2)
    ckpt.save_best(d, model, tiny_config, 30, 2.0)
    assert cfiles.find_inference_checkpoint(run).name == "best.safetensors"


def test_describe_checkpoint_names_path_and_step(tmp_path, model, tiny_config):
    path = ckpt.save_checkpoint(tmp_path, 42, model, trainer_state(model, tiny_config), tiny_config, keep_last=1)
    line = cfiles.describe_checkpoint(path, "newest step checkpoint")
    assert line == f"loaded {path} (step 42; newest step checkpoint)"


def test_average_last_with_fewer_kept_says_how_many(tmp_path, model, tiny_config):
    state = trainer_state(model, tiny_config)
    for step in (10, 20):
        ckpt.save_checkpoint(tmp_path / "checkpoints", step, model, state, tiny_config, keep_last=2)
    result = ckpt.average_last(tmp_path, 5)
    assert result.steps == [10, 20] and result.requested == 5
    assert "averaged 2 checkpoint(s) (steps 10, 20)" in result.message()
    assert "--last 5 asked for 5, but the run keeps only 2" in result.message()
    assert "asked for" not in ckpt.average_last(tmp_path, 2).message()


@pytest.mark.slow
def test_translate_loads_what_the_newest_training_made(tiny_run, mini_mirror, tmp_path):
    """The issue's scenario: pipeline, then `nmt train --set train.max_steps=...` on the same run."""
    import shutil

    from typer.testing import CliRunner

    from nmt.cli import app

    def cli(*args: str):
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return result

    run = tmp_path / "tiny"
    shutil.copytree(tiny_run, run)
    trained = cfiles.checkpoint_step(cfiles.latest_checkpoint(run / "checkpoints"))
    loaded = cli("translate", "--run", run, "我爱 AI").stderr
    assert f"loaded {run / 'checkpoints' / 'final.safetensors'} (step" in loaded
    assert f"after training step {trained}" in loaded
    cli("train", "--run", run, "--set", f"train.max_steps={trained + 15}")
    loaded = cli("translate", "--run", run, "我爱 AI").stderr.splitlines()
    line = next(x for x in loaded if x.startswith("loaded "))
    assert not line.startswith(f"loaded {run / 'checkpoints' / 'final.safetensors'}")
    assert "stale" in line and f"training reached step {trained + 15}" in line
    cli("pipeline", "--run", run, "--mirror", mini_mirror)  # selects again from the newest training
    loaded = cli("eval", "--run", run, "--split", "valid", "--beam", "1").stderr
    assert f"loaded {run / 'checkpoints' / 'final.safetensors'} (step" in loaded
    assert f"after training step {trained + 15}" in loaded

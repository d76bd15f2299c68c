"""Resuming on a different number of ranks (`nmt.train.resume.reshard`), and fine-tuning (`train.init_from`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from nmt.train.resume import reshard
from nmt.train.update import TrainState


def test_same_rank_count_changes_nothing():
    state = TrainState(step=40, epoch=2, batch_in_epoch=7)
    assert reshard(state, 2, 2) is None
    assert (state.epoch, state.batch_in_epoch) == (2, 7)


def test_a_new_rank_count_mid_epoch_keeps_the_data_position():
    """The position is the epoch's global batch index: it means the same on any number of ranks
    (tests/batches/test_batching.py checks the batches; tests/train/test_distributed.py a resumed run)."""
    state = TrainState(step=40, epoch=2, batch_in_epoch=14, tokens=1234, best_bleu=12.5)
    before = dataclasses.replace(state)
    note = reshard(state, 2, 1)
    assert note == "resuming on 1 ranks (saved with 2): the data continues at batch 14 of epoch 2"
    assert state == before


# --------------------------------------------------------------------------- fine-tuning (train.init_from)


def _tiny(*overrides: str):
    from conftest import ROOT, TINY_LEARNS

    from nmt.config import load_config

    return load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, *overrides])


def test_the_other_direction_or_another_shape_is_refused_in_one_line():
    from nmt.errors import NmtError
    from nmt.train.resume import check_init_source

    ours = _tiny()
    path = Path("runs/x/checkpoints/final.safetensors")
    check_init_source(_tiny("model.dropout=0.3"), ours, path)  # dropout does not change the weights
    cases = [
        (_tiny("data.src_lang=en", "data.tgt_lang=zh"), "translates en→zh, this run zh→en"),
        (_tiny("model.d_model=32"), "has model.d_model=32, this run's config 64"),
        (_tiny("model.tie_embeddings=false"), "has model.tie_embeddings=False"),
    ]
    for stored, message in cases:
        with pytest.raises(NmtError, match=message) as err:
            check_init_source(stored, ours, path)
        assert "\n" not in str(err.value) and str(path) in str(err.value)


@pytest.fixture(scope="module")
def fine_tune_run(tiny_run, mini_mirror, tmp_path_factory) -> tuple[Path, object]:
    """A new run whose config starts from the tiny run's final checkpoint, corpus and vocab made."""
    from nmt.data.corpus import prepare_corpus
    from nmt.data.vocab import build_vocab
    from nmt.run.dirs import init_run

    run = tmp_path_factory.mktemp("ft") / "run"
    source = tiny_run / "checkpoints" / "final.safetensors"
    config = _tiny(f"train.init_from={source}", "train.max_steps=3", "train.eval_every=100", "train.lr=1e-4")
    init_run(config, run)
    prepare_corpus(config, run, mirror=str(mini_mirror))
    build_vocab(config, run)
    return run, config


@pytest.mark.slow
def test_fine_tuning_copies_the_vocabularies_and_starts_from_the_weights(tiny_run, fine_tune_run):
    from safetensors.torch import load_file

    from nmt.model.transformer import build_model
    from nmt.train.resume import init_weights

    run, config = fine_tune_run
    for name in ("zh.model", "en.model"):
        assert (run / "vocab" / name).read_bytes() == (tiny_run / "vocab" / name).read_bytes()
    source = load_file(str(config.train.init_from))
    model = build_model(config, source["src_embed.weight"].shape[0], source["tgt_embed.weight"].shape[0])
    note = init_weights(model, config)
    assert note.startswith(f"initialised from {config.train.init_from}")
    for name, tensor in model.state_dict().items():
        if name in source:
            assert torch.equal(tensor, source[name]), name  # step 0 is the source checkpoint, exactly


@pytest.mark.slow
def test_fine_tuning_trains_with_a_fresh_step_count(fine_tune_run):
    from nmt.train.loop import fit

    run, config = fine_tune_run
    summary = fit(config, run, restart=True)
    assert summary["steps"] == 3  # counted from 0, not from the source run's step
    assert summary["checkpoint"].endswith("step_3.safetensors")
    assert f"initialised from {config.train.init_from}" in (run / "train.log").read_text()


@pytest.mark.slow
def test_a_run_whose_vocabulary_is_not_the_sources_is_refused(fine_tune_run, tmp_path):
    import shutil

    from nmt.data.vocab import check_vocab_copied
    from nmt.errors import NmtError

    run, config = fine_tune_run
    other = tmp_path / "other"
    shutil.copytree(run / "vocab", other / "vocab")
    shutil.copy(other / "vocab" / "zh.model", other / "vocab" / "en.model")
    check_vocab_copied(config, run)
    with pytest.raises(NmtError, match="en.model: not the vocabulary of train.init_from's run") as err:
        check_vocab_copied(config, other)
    assert "run `nmt vocab`" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_cli_init_from_a_checkpoint_of_another_shape_is_one_line(fine_tune_run, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from nmt.cli import app

    run, config = fine_tune_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    result = CliRunner().invoke(
        app, ["train", "--run", str(copy), "--set", "model.d_model=32", "--init-from", config.train.init_from]
    )
    assert result.exit_code == 1
    assert (
        result.stderr.startswith("error: train.init_from:")
        and "model.d_model=64, this run's config 32" in result.stderr
    )
    assert result.stderr.count("\n") == 1

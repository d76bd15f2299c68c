"""The validation BLEU a run recorded for a model, and the floor `nmt backtranslate` holds a
reverse model to (nmt/decode/valid_score.py), on hand-made checkpoints and stamps."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nmt.decode.valid_score import MIN_VALID_BLEU, require_valid_bleu, validation_bleu
from nmt.errors import NmtError


def checkpoint(run: Path, name: str, **meta: str) -> Path:
    path = run / "checkpoints" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.zeros(1)}, str(path), metadata={"step": "100", **meta})
    return path


def test_final_reads_the_select_stamp_of_the_candidate_it_is(tmp_path):
    final = checkpoint(tmp_path, "final.safetensors", selected="averaged", bleu="30.0")
    stamp = tmp_path / "select.stamp.json"
    stamp.write_text(json.dumps({"inputs": "x", "valid_bleu": {"averaged": 12.5, "best": 11.0}, "chosen": "averaged"}))
    assert validation_bleu(final) == (12.5, f"{stamp} (valid_bleu.averaged)")


def test_best_reads_its_own_metadata_and_a_step_checkpoint_has_none(tmp_path):
    best = checkpoint(tmp_path, "best.safetensors", bleu="8.2500")
    score, where = validation_bleu(best)
    assert score == 8.25 and str(best) in where
    assert validation_bleu(checkpoint(tmp_path, "step_100.safetensors")) is None


def test_an_export_directory_is_scored_by_the_checkpoint_its_manifest_names(tmp_path):
    best = checkpoint(tmp_path, "best.safetensors", bleu="21.0")
    export = tmp_path / "export" / "ct2"
    export.mkdir(parents=True)
    (export / "manifest.json").write_text(json.dumps({"checkpoint": str(best)}))
    assert validation_bleu(export)[0] == 21.0
    (export / "manifest.json").write_text(json.dumps({"checkpoint": str(tmp_path / "gone.safetensors")}))
    assert validation_bleu(export) is None


def test_the_floor_refuses_in_one_line_naming_score_source_and_floor(tmp_path):
    best = checkpoint(tmp_path, "best.safetensors", bleu="3.15")
    with pytest.raises(NmtError) as e:
        require_valid_bleu(best, 10.0)
    message = str(e.value)
    assert "\n" not in message and "3.15" in message and str(best) in message and "floor 10" in message
    assert "3.15" in require_valid_bleu(best, 3.0)  # reaches a lower floor
    assert "3.15" in require_valid_bleu(best, 0)  # 0: off


def test_a_model_without_a_score_passes_only_a_zero_floor(tmp_path):
    step = checkpoint(tmp_path, "step_100.safetensors")
    with pytest.raises(NmtError, match="no validation BLEU recorded.*--min-valid-bleu 0"):
        require_valid_bleu(step, 5.0)
    assert require_valid_bleu(step, 0) == "validation BLEU not checked"


def test_the_cli_defaults_are_the_modules_defaults():
    from nmt.cli.decoding import backtranslate
    from nmt.decode.backtranslate import BacktranslateOptions

    parameters = inspect.signature(backtranslate).parameters
    assert parameters["min_valid_bleu"].default == MIN_VALID_BLEU > 0
    options = {f.name: f.default for f in BacktranslateOptions.__dataclass_fields__.values()}
    assert options["min_valid_bleu"] == MIN_VALID_BLEU and options["no_repeat_ngram"] == 3
    assert parameters["no_repeat_ngram"].default == options["no_repeat_ngram"]

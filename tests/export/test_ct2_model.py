"""CTranslate2 export (nmt/export/ct2_model.py, ct2_spec.py): numerics of the converted weights,
the manifest and its reuse, refusals, `nmt export`.

The trained model is the session's `tiny_run` (tests/conftest.py: the generated zh→en corpus of
tests/synthetic.py), copied so that export caches written here stay out of it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from nmt.config import ModelConfig, config_to_yaml, load_config
from nmt.errors import NmtError

ctranslate2 = pytest.importorskip("ctranslate2", reason="optional extra nmt[ctranslate2] is not installed")

from nmt.cli import app  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.export import ct2_model, ct2_spec  # noqa: E402  (after the skip: only useful with the package)

pytestmark = pytest.mark.usefixtures("one_thread")


def _lines(run: Path, name: str) -> list[str]:
    return (run / "corpus" / name).read_text(encoding="utf-8").splitlines()


# --------------------------------------------------------------------------- numerics


VARIANTS = [{}, {"norm": "post"}, {"positions": "learned"}, {"activation": "gelu"}, {"tie_embeddings": False}]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "default")
@pytest.mark.slow
def test_converted_log_probs_equal_the_model(trained_run, tmp_path, variant):
    """Teacher-forced log-probabilities of CTranslate2's `score_batch` equal nmt's (random weights,
    perturbed so that biases and norms are not trivial), for each architecture option."""
    from nmt.batches.batching import pad_sources
    from nmt.model.transformer import build_model

    config = load_config(trained_run / "config.yaml")
    config.model = dataclasses.replace(config.model, **variant)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("vocab", "config.yaml"):
        src = trained_run / name
        (run / name).symlink_to(src, target_is_directory=src.is_dir())
    native = Translator.from_run(trained_run)
    model = build_model(config, native.src_tok.vocab_size, native.tgt_tok.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(run / "checkpoints" / "final.safetensors"), {"config": config_to_yaml(config), "step": "3"})
    out = ct2_model.export_run(ct2_model.ExportOptions(run))
    translator = ctranslate2.Translator(str(out), compute_type="float32", intra_threads=1)
    src = native.encode_sources(_lines(trained_run, "valid.zh")[:8])
    tgt = [native.tgt_tok.encode(line) for line in _lines(trained_run, "valid.en")[8:16]]
    pieces = [native.src_tok.piece, native.tgt_tok.piece]
    scored = translator.score_batch(
        [[pieces[0](t) for t in s] for s in src], [[pieces[1](t) for t in t_] for t_ in tgt]
    )
    with torch.no_grad():
        for s, t, result in zip(src, tgt, scored, strict=True):
            logits = model(pad_sources([s]), torch.tensor([[2, *t]]))[0]  # (T+1, V)
            expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor([*t, 3])[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(result.log_probs), expected, atol=1e-4)


# --------------------------------------------------------------------------- manifest and reuse


@pytest.mark.slow
def test_export_manifest_and_reuse(trained_run, tmp_path):
    from nmt.run.checkpoints import checkpoint_step, find_inference_checkpoint

    out = ct2_model.export_run(ct2_model.ExportOptions(trained_run, output=tmp_path / "model"))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    checkpoint = find_inference_checkpoint(trained_run)
    assert manifest["format"] == "ctranslate2" and manifest["quantization"] == "float32"
    assert Path(manifest["run"]) == trained_run.resolve()
    assert Path(manifest["checkpoint"]) == checkpoint.resolve()
    assert manifest["step"] == checkpoint_step(checkpoint) > 0
    model = dataclasses.asdict(load_config(trained_run / "config.yaml").model)
    assert manifest["config"]["model"] == model
    assert manifest["nmt_version"]
    stats = json.loads((trained_run / "corpus/stats.json").read_text(encoding="utf-8"))
    assert manifest["training_data"] == stats["provenance"] and manifest["training_data"]["corpora"]
    assert (out / "source.model").read_bytes() == (trained_run / "vocab" / "zh.model").read_bytes()
    assert (out / "target.model").read_bytes() == (trained_run / "vocab" / "en.model").read_bytes()
    assert ctranslate2.contains_model(str(out))
    stamp = (out / "model.bin").stat().st_mtime_ns
    assert ct2_model.export_run(ct2_model.ExportOptions(trained_run, output=tmp_path / "model")) == out
    assert (out / "model.bin").stat().st_mtime_ns == stamp, "a fresh export is reused, not rewritten"


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation": "swish"}, "model.activation: 'swish' cannot be exported to CTranslate2"),
        ({"norm": "rms"}, "model.norm: 'rms' cannot be exported"),
        ({"positions": "rotary"}, "model.positions: 'rotary' cannot be exported"),
    ],
)
def test_unrepresentable_options_are_refused(change, message):
    cfg = dataclasses.replace(ModelConfig(), **change)  # values the config loader would not accept today
    with pytest.raises(NmtError, match=message):
        ct2_spec.check_representable(cfg)


def test_unknown_model_option_is_refused():
    @dataclasses.dataclass
    class Newer(ModelConfig):
        alibi: bool = True

    with pytest.raises(NmtError, match="model.alibi: option unknown to the CTranslate2 exporter"):
        ct2_spec.check_representable(Newer())
    ct2_spec.check_representable(ModelConfig())  # today's options all export


@pytest.mark.slow
def test_parameter_without_counterpart_is_refused(trained_run, tmp_path):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "vocab").symlink_to(trained_run / "vocab", target_is_directory=True)
    (run / "config.yaml").symlink_to(trained_run / "config.yaml")
    state = load_file(str(trained_run / "checkpoints" / "best.safetensors"))
    state["decoder.gate.weight"] = torch.zeros(4)
    config = load_config(trained_run / "config.yaml")
    save_file(state, str(run / "checkpoints" / "final.safetensors"), {"config": config_to_yaml(config), "step": "1"})
    with pytest.raises(NmtError, match="parameter 'decoder.gate.weight' has no CTranslate2 counterpart"):
        ct2_model.export_run(ct2_model.ExportOptions(run))
    assert not (run / "export").exists() or not any((run / "export").iterdir()), "nothing half-written"


@pytest.mark.slow
def test_vocabulary_of_another_size_is_refused(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval", "export"))
    shutil.copyfile(run / "vocab" / "zh.model", run / "vocab" / "en.model")  # sizes differ
    with pytest.raises(NmtError, match="CTranslate2 refused the model .*vocabulary"):
        ct2_model.export_run(ct2_model.ExportOptions(run))


# --------------------------------------------------------------------------- command line


@pytest.mark.slow
def test_cli_export(trained_run, tmp_path):
    result = CliRunner().invoke(
        app,
        ["export", "--run", str(trained_run), "--output", str(tmp_path / "m"), "--quantization", "int8"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0 and result.stdout.strip() == f"wrote {tmp_path / 'm'}"
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["quantization"] == "int8"

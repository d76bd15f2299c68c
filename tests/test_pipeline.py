"""`nmt pipeline` end to end on the generated corpus (tests/synthetic.py): every artifact, and it learns.

LEARNED_BLEU: configs/tiny.yaml with conftest.TINY_LEARNS (200 steps, one thread) reaches test BLEU
57.6 / chrF 77.9 on the 100 generated test pairs (measured 2026-11-30, AMD EPYC, 21 s for the whole
pipeline); an untrained model scores 0. The thresholds leave a wide margin for other CPUs.
"""

import json

import pytest
from learning import assert_learned

from nmt.config import load_config
from nmt.pipeline import run_pipeline

pytestmark = pytest.mark.slow  # every test runs `nmt pipeline` (the shared tiny run, or one of its own)
LEARNED_BLEU, LEARNED_CHRF = 30.0, 55.0


@pytest.mark.learning
def test_pipeline_makes_every_artifact(tiny_run):
    for rel in [
        "config.yaml",
        "corpus/train.zh",
        "corpus/test.en",
        "corpus/stats.json",
        "vocab/zh.model",
        "vocab/en.model",
        "bin/train/manifest.json",
        "checkpoints/final.safetensors",
        "eval/test.json",
        "train.log",
    ]:
        assert (tiny_run / rel).is_file(), rel
    report = json.loads((tiny_run / "eval" / "test.json").read_text())
    assert_learned("tiny-pipeline/test_bleu", report["bleu"], LEARNED_BLEU)
    assert_learned("tiny-pipeline/test_chrf", report["chrf"], LEARNED_CHRF)
    assert set(report["by_code"]) == {"cmn_Hans", "cmn_Hant"}  # test.codes.txt of the generated mirror
    select = json.loads((tiny_run / "select.stamp.json").read_text())
    assert select["chosen"] in select["valid_bleu"]


def test_pipeline_exports_the_final_model_for_ctranslate2(tiny_run):
    """So that `nmt translate` (--engine auto) answers without PyTorch right after the pipeline."""
    pytest.importorskip("ctranslate2")
    from nmt.decode.loading import resolve_engine
    from nmt.export.ct2_model import fresh_export

    final = tiny_run / "checkpoints" / "final.safetensors"
    assert fresh_export(tiny_run, final) == tiny_run / "export" / "ct2-final-float32"
    assert resolve_engine("auto", tiny_run, None).name == "ctranslate2"


def test_second_pipeline_run_skips_every_stage(tiny_run, mini_mirror):
    config = load_config(tiny_run / "config.yaml")
    before = (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns
    result = run_pipeline(config, tiny_run, mirror=str(mini_mirror))
    assert set(result["stages"].values()) == {"skipped"}, result["stages"]
    assert (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns == before
    assert result["eval"]["bleu"] > LEARNED_BLEU


@pytest.mark.learning
def test_an_en_zh_run_learns_the_task_the_other_way(tiny_en_zh_run):
    """data.direction: en-zh swaps every side: the English model is the source vocabulary (no byte
    fallback), the Chinese one the target (byte fallback), BLEU uses sacreBLEU's zh tokenizer, and
    Traditional targets are converted to Simplified. Measured 2026-12-01 on the generated task:
    test BLEU 68.8 (tok:zh) after 200 steps, 16 s on one core."""
    run = tiny_en_zh_run
    report = json.loads((run / "eval" / "test.json").read_text(encoding="utf-8"))  # the pipeline's eval
    assert report["src"].endswith("test.en") and report["ref"].endswith("test.zh")
    assert "tok:zh" in report["bleu_signature"]
    assert_learned("tiny-pipeline-en-zh/test_bleu", report["bleu"], LEARNED_BLEU)
    vocab = json.loads((run / "vocab.stamp.json").read_text())["report"]
    assert vocab["zh"]["byte_fallback"] and not vocab["en"]["byte_fallback"]
    hyps = (run / "eval" / "test.hyp").read_text(encoding="utf-8")
    assert not set(hyps) & set("這個書買貓鳥點")  # the model writes Simplified: its targets were converted
    assert "Traditional→Simplified" in report["references"]  # and is scored against Simplified references

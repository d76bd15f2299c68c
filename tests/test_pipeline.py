"""`nmt pipeline` end to end on the generated corpus (tests/synthetic.py): every artifact, and it learns.

LEARNED_BLEU: configs/tiny.yaml with conftest.TINY_LEARNS (200 steps, one thread) reaches test BLEU
57.6 / chrF 77.9 on the 100 generated test pairs (measured 2026-11-30, AMD EPYC, 21 s for the whole
pipeline); an untrained model scores 0. The thresholds leave a wide margin for other CPUs.
"""

import json

from nmt.config import load_config
from nmt.pipeline import run_pipeline

LEARNED_BLEU, LEARNED_CHRF = 30.0, 55.0


def test_pipeline_makes_every_artifact(tiny_run):
    for rel in [
        "config.yaml",
        "corpus/train.zh",
        "corpus/test.en",
        "corpus/stats.json",
        "vocab/zh.model",
        "vocab/en.model",
        "bin/train.zh.npy",
        "checkpoints/final.safetensors",
        "eval/test.json",
        "train.log",
    ]:
        assert (tiny_run / rel).is_file(), rel
    report = json.loads((tiny_run / "eval" / "test.json").read_text())
    assert report["bleu"] > LEARNED_BLEU and report["chrf"] > LEARNED_CHRF, report["bleu_detail"]
    assert set(report["by_code"]) == {"cmn_Hans", "cmn_Hant"}  # test.codes.txt of the generated mirror
    select = json.loads((tiny_run / "select.stamp.json").read_text())
    assert select["chosen"] in select["valid_bleu"]


def test_second_pipeline_run_skips_every_stage(tiny_run, mini_mirror):
    config = load_config(tiny_run / "config.yaml")
    before = (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns
    result = run_pipeline(config, tiny_run, mirror=str(mini_mirror))
    assert set(result["stages"].values()) == {"skipped"}, result["stages"]
    assert (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns == before
    assert result["eval"]["bleu"] > LEARNED_BLEU

import json

from nmt.config import load_config
from nmt.pipeline import run_pipeline


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
    assert 0.0 <= report["bleu"] <= 100.0
    select = json.loads((tiny_run / "select.stamp.json").read_text())
    assert select["chosen"] in select["valid_bleu"]


def test_second_pipeline_run_skips_every_stage(tiny_run, mini_mirror):
    config = load_config(tiny_run / "config.yaml")
    before = (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns
    result = run_pipeline(config, tiny_run, mirror=str(mini_mirror))
    assert set(result["stages"].values()) == {"skipped"}, result["stages"]
    assert (tiny_run / "checkpoints" / "final.safetensors").stat().st_mtime_ns == before
    assert 0.0 <= result["eval"]["bleu"] <= 100.0

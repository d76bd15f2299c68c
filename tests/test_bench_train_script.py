"""scripts/bench_train.py: one variant of a recipe trained and measured in this process."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_train", ROOT / "scripts" / "bench_train.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


@pytest.mark.slow
def test_a_recipe_with_guided_alignment_is_measured(tmp_path, mini_mirror):
    """A recipe with ``train.guided_alignment`` (both shipped recipes) trains under the bench: its
    trainer gets the run's copy keys, as `nmt train` gives them."""
    recipe = tmp_path / "guided.yaml"
    text = (ROOT / "configs" / "tiny.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace("train:\n", "train:\n  guided_alignment: 1.0\n", 1), encoding="utf-8")
    args = argparse.Namespace(run=tmp_path / "run", config=recipe, mirror=str(mini_mirror), warmup=1, steps=2)
    args.threads = 1
    script.prepare_data(args)
    result = script.run_one(args, "fp32-auto")
    assert result["steps"] == 2 and result["tgt_tok_s"] > 0 and result["loss_first"] > 0
    assert script.reference_config("fp32-auto", recipe).train.guided_alignment == 1.0

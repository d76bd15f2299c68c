"""scripts/profile_train.py: where a training update's time goes, by category, under torch.profiler."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT

from nmt.config import load_config
from nmt.model.shared_rows import SharedRowsEmbedding

spec = importlib.util.spec_from_file_location("profile_train", ROOT / "scripts" / "profile_train.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script
spec.loader.exec_module(script)


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("aten::mm", script.MATMUL),
        ("aten::addmm", script.MATMUL),
        ("aten::bmm", script.MATMUL),
        ("aten::linear", script.MATMUL),
        ("aten::matmul", script.MATMUL),
        ("aten::scaled_dot_product_attention", script.ATTENTION),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", script.ATTENTION),
        ("aten::_log_softmax", script.LOSS),
        ("aten::_softmax_backward_data", script.LOSS),
        ("aten::nll_loss_forward", script.LOSS),
        ("autograd::engine::evaluate_function: _SmoothedCrossEntropyBackward", script.LOSS),
        ("_ProjectedSmoothedCrossEntropy", script.LOSS),
        ("_MaskedScale", script.DROPOUT),
        ("autograd::engine::evaluate_function: _MaskedScaleBackward", script.DROPOUT),
        ("aten::native_layer_norm_backward", script.LAYER_NORM),
        ("aten::layer_norm", script.LAYER_NORM),
        ("aten::bernoulli_", script.DROPOUT),
        ("aten::native_dropout", script.DROPOUT),
        ("aten::dropout", script.DROPOUT),
        ("aten::_fused_adamw_", script.OPTIMIZER),
        ("aten::_foreach_norm", script.OPTIMIZER),
        ("Optimizer.step#AdamW.step", script.OPTIMIZER),
        ("aten::embedding", script.ELEMENTWISE),
        ("aten::add_", script.ELEMENTWISE),
        ("aten::relu", script.ELEMENTWISE),
        ("AddmmBackward0", script.OVERHEAD),
        ("autograd::engine::evaluate_function: MmBackward0", script.OVERHEAD),
        (script.DATA_RANGE, script.DATA),
    ],
)
def test_each_operator_name_falls_in_its_category(name, category):
    assert script.categorise(name) == category


def _event(name: str, self_us: float, *children: SimpleNamespace) -> SimpleNamespace:
    event = SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_parent=None, cpu_children=list(children))
    for child in children:
        child.cpu_parent = event
    return event


def _flatten(*roots: SimpleNamespace) -> list[SimpleNamespace]:
    out, stack = [], list(roots)
    while stack:
        e = stack.pop()
        out.append(e)
        stack.extend(e.cpu_children)
    return out


def test_element_wise_work_inside_a_named_operator_counts_with_it_and_data_is_left_to_the_clock():
    loss = _event("autograd::engine::evaluate_function: _SmoothedCrossEntropyBackward", 5, _event("aten::exp", 40))
    linear = _event("aten::linear", 1, _event("aten::t", 2), _event("aten::addmm", 100))
    node = _event("MmBackward0", 3, _event("aten::mm", 50), _event("aten::add_", 7))
    data = _event(script.DATA_RANGE, 30, _event("aten::stack", 20))
    totals = script.self_times(_flatten(loss, linear, node, data, _event("aten::mul", 9)))
    assert totals[script.LOSS] == 45
    assert totals[script.MATMUL] == 153  # linear + its transpose + addmm + mm
    assert totals[script.OVERHEAD] == 3  # the autograd node's own time; its add_ is element-wise
    assert totals[script.ELEMENTWISE] == 16
    assert totals[script.DATA] == 0  # the batch feed is timed by the wall clock, its operators not counted


def test_the_rows_split_the_wall_time_so_the_shares_sum_to_one():
    totals = dict.fromkeys(script.CATEGORIES, 0.0) | {script.MATMUL: 600e3, script.ATTENTION: 100e3}
    timed = script.Updates(wall=1.0, data=0.1, flops=8e9, dense_flops=6e9)
    rows = {r["category"]: r for r in script.table_rows(totals, timed, steps=2, peak=1e10)}
    assert rows[script.MATMUL]["ms_per_update"] == pytest.approx(300)
    assert rows[script.DATA]["ms_per_update"] == pytest.approx(50)
    assert rows[script.OVERHEAD]["ms_per_update"] == pytest.approx(500 - 300 - 50 - 50)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert rows[script.MATMUL]["flops_at_peak_ms"] == pytest.approx(300)  # 3e9 FLOPs per update at 1e10/s
    assert rows[script.ATTENTION]["flops_at_peak_ms"] == pytest.approx(100)
    assert rows[script.LOSS]["flops_at_peak_ms"] is None


@pytest.fixture(scope="module")
def prepared_run(tmp_path_factory, mini_mirror) -> Path:
    """configs/tiny.yaml's corpus and vocabularies made from the generated mirror (no training)."""
    from nmt.data.corpus import prepare_corpus
    from nmt.data.vocab import build_vocab
    from nmt.run.dirs import init_run

    config = load_config(ROOT / "configs" / "tiny.yaml")
    run = tmp_path_factory.mktemp("profile") / "tiny"
    init_run(config, run, latest=False)
    prepare_corpus(config, run, mirror=str(mini_mirror))
    build_vocab(config, run)
    return run


@pytest.mark.slow
def test_two_profiled_updates_of_the_tiny_config_give_a_table_that_adds_up(prepared_run, tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.precision=fp32", "--run",
            str(prepared_run), "--steps", "2", "--warmup", "1", "--threads", "1", "--peak-size", "128",
            "--json", str(out)]  # fmt: skip
    assert script.main(argv) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {r["category"]: r for r in report["rows"]}
    assert set(rows) == set(script.CATEGORIES)
    assert sum(r["share"] for r in report["rows"]) == pytest.approx(1.0, abs=1e-6)
    assert sum(r["ms_per_update"] for r in report["rows"]) == pytest.approx(report["wall_ms_per_update"])
    assert rows[script.MATMUL]["ms_per_update"] > 0 and rows[script.MATMUL]["flops_at_peak_ms"] > 0
    assert rows[script.DATA]["ms_per_update"] > 0
    assert report["precision"] == "fp32" and report["steps"] == 2 and 0 < report["mfu"] < 1
    assert 0 < report["cpu_per_wall"] <= 1.05  # one thread: at most its wall time on a core
    printed = capsys.readouterr().out
    assert "| matmul |" in printed and "MFU" in printed and report["cpu"] in printed


@pytest.mark.slow
def test_the_set_up_shares_piece_rows_as_the_loop_does(prepared_run):
    """With train.share_piece_embeddings the profiled model reads shared rows from the target
    table, and the source table holds them again after each update (the loop's sync)."""
    config = load_config(ROOT / "configs" / "tiny.yaml", ["train.precision=fp32", "train.share_piece_embeddings=true"])
    training = script.Training(config, prepared_run)
    try:
        embed = training.model.src_embed
        assert isinstance(embed, SharedRowsEmbedding) and len(embed.src_rows) > 10
        before = training.model.tgt_embed.weight[embed.tgt_rows].detach().clone()
        training.run(1)
        after = training.model.tgt_embed.weight[embed.tgt_rows]
        assert not torch.equal(before, after) and torch.equal(embed.weight[embed.src_rows], after)
    finally:
        training.close()


@pytest.mark.slow
def test_the_set_up_trains_with_guided_alignment_as_the_loop_does(prepared_run):
    """Both shipped recipes set train.guided_alignment: the profiled trainer gets the run's copy
    keys (`nmt.train.loop.build_trainer`, as `nmt train` builds it) and trains with the guided head."""
    config = load_config(ROOT / "configs" / "tiny.yaml", ["train.precision=fp32", "train.guided_alignment=1.0"])
    training = script.Training(config, prepared_run)
    try:
        assert training.trainer.guide is not None
        assert training.run(1).wall > 0
    finally:
        training.close()

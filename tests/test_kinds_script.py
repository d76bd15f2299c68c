"""scripts/test_kinds.py: which kinds a CPU has, the table's cells, and one real run of a kind."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("test_kinds_script_module", ROOT / "scripts" / "test_kinds.py")
kinds = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = kinds
spec.loader.exec_module(kinds)


def test_an_avx2_cpu_has_no_avx512_kinds_and_says_why():
    ok, left_out = kinds.host_kinds(frozenset({"avx2", "fma"}))
    names = {k.name for k in ok}
    assert {"native", "aten-default", "aten-avx2", "onednn-avx2", "avx2-host", "without-aarch64"} <= names
    assert not names & {"aten-avx512", "onednn-avx512", "onednn-avx512-bf16", "onednn-amx"}
    assert dict((k.name, why) for k, why in left_out)["onednn-amx"].startswith("needs amx_bf16")


def test_a_cpu_without_flags_keeps_the_kinds_that_need_none():
    ok, _ = kinds.host_kinds(frozenset())
    assert [k.name for k in ok] == [k.name for k in kinds.KINDS if not k.needs]


def test_cells_count_failures_per_group():
    outcomes = [
        {"groups": ["learning"], "outcome": "passed"},
        {"groups": ["learning", "precision"], "outcome": "failed"},
        {"groups": ["invariance"], "outcome": "skipped"},
    ]
    assert kinds.outcome_cell(outcomes, "learning") == "1 of 2 FAILED"
    assert kinds.outcome_cell(outcomes, "precision") == "1 of 1 FAILED"
    assert kinds.outcome_cell(outcomes, "invariance") == "0 passed"
    assert kinds.outcome_cell(outcomes, "int8") == "-"


@pytest.mark.slow
def test_a_kind_runs_its_group_in_a_capped_process(capsys):
    """One real run: the toy invariance test under ATen's default kernels, reported by group."""
    code = kinds.main(
        ["--kinds", "aten-default", "--groups", "invariance", "--", "tests/decode/test_search.py", "-k", "toy"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "aten-default seed 1" in out and "1 passed" in out
    assert out.rstrip().splitlines()[-1] == "test-kinds: 1 passed, 0 failed, 0 skipped"

"""The CTranslate2 engine (nmt/decode/ct2.py): parity of the two engines on a trained model, the
engine's export cache, quantised exports decoded, CLI errors (the export itself:
tests/export/test_ct2_model.py).

The trained model is the session's `tiny_run` (tests/conftest.py: the generated zh→en corpus of
tests/synthetic.py), copied so that export caches and reports written here stay out of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from learning import assert_learned
from typer.testing import CliRunner

from nmt.config import DecodeConfig, load_config
from nmt.errors import NmtError

ctranslate2 = pytest.importorskip("ctranslate2", reason="optional extra nmt[ctranslate2] is not installed")

from nmt.cli import app  # noqa: E402
from nmt.decode import ct2  # noqa: E402  (after the skip: the modules are only useful with the package)
from nmt.decode.translator import Translator  # noqa: E402
from nmt.export import ct2_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _lines(run: Path, name: str) -> list[str]:
    return (run / "corpus" / name).read_text(encoding="utf-8").splitlines()


def _agreement(a: list[str], b: list[str]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


# --------------------------------------------------------------------------- parity


@pytest.mark.invariance
@pytest.mark.slow
def test_engines_agree_on_a_trained_model(trained_run):
    from nmt.decode.evaluate import score

    src, ref = _lines(trained_run, "valid.zh"), _lines(trained_run, "valid.en")
    more = _lines(trained_run, "test.zh")  # more lines for the agreement
    native = Translator.from_run(trained_run, precision="fp32")
    fast = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2")
    assert fast.engine.name == "ctranslate2" and fast.precision == "fp32"
    for beam in (1, 5):
        a, b = native.translate(src + more, beam=beam), fast.translate(src + more, beam=beam)
        assert _agreement(a, b) >= 0.98, f"beam {beam}"
        a, b = a[: len(src)], b[: len(src)]
        bleu_a, bleu_b = score(a, ref)["bleu"], score(b, ref)["bleu"]
        assert_learned("tiny-pipeline/ct2_valid_bleu", bleu_a, 20)  # the model learned something
        # the engines' fp32 kernels sum in other orders: the few lines that differ (<= 2%) move the BLEU
        # of this small set by up to ~0.3 (0.27 at beam 5 on an AMD EPYC with AVX2 only, 2026-12-05)
        assert abs(bleu_a - bleu_b) <= 0.4, f"beam {beam}: BLEU {bleu_a:.2f} vs {bleu_b:.2f}"


@pytest.mark.slow
@pytest.mark.invariance
def test_engines_agree_with_no_repeat_ngram(trained_run):
    """decode.no_repeat_ngram reaches CTranslate2 in greedy and beam search alike. Greedy: the
    same outputs as the native (reference) search, not those without the rule. Beam: CTranslate2
    renormalises after blocking (module docstring of nmt/decode/ct2.py), so only the change is checked."""
    src = _lines(trained_run, "valid.zh") + _lines(trained_run, "test.zh")
    config = load_config(trained_run / "config.yaml")
    blocked = dataclasses.replace(config, decode=dataclasses.replace(config.decode, no_repeat_ngram=2))
    native = Translator.from_run(trained_run, precision="fp32", config=blocked)
    fast = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2", config=blocked)
    free = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2", config=config)
    greedy = native.translate(src, beam=1)
    assert _agreement(greedy, fast.translate(src, beam=1)) >= 0.98
    assert greedy != free.translate(src, beam=1), "the rule changed nothing"
    assert fast.translate(src, beam=4) != free.translate(src, beam=4)


@pytest.mark.slow
def test_sampling_maps_onto_ctranslate2s_options(trained_run):
    """top-k 1 is greedy in both engines; a seed reproduces CTranslate2's draws; a wide top-k samples."""
    from nmt.decode.options import Sampling

    src = _lines(trained_run, "valid.zh")[:40]
    fast = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2")
    greedy = fast.translate(src, beam=1)
    fast.sampling = Sampling(topk=1, seed=4)
    assert fast.translate(src) == greedy
    fast.sampling = Sampling(topk=0, temperature=1.5, seed=4)
    drawn = fast.translate(src)
    assert drawn != greedy and len(drawn) == len(src)


@pytest.mark.slow
def test_ctranslate2_sampling_is_reproducible_from_process_to_process(trained_run):
    """CTranslate2 seeds its generators when its threads first sample: two fresh processes with
    the same seed print the same samples (within one process, each call draws on)."""
    cmd = [sys.executable, "-m", "nmt", "translate", "--run", str(trained_run), "--engine", "ctranslate2"]
    cmd += ["--sample-topk", "0", "--temperature", "1.5", "--seed", "4", *_lines(trained_run, "valid.zh")[:12]]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    first, second = (subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300) for _ in range(2))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and len(first.stdout.splitlines()) == 12


@pytest.mark.slow
def test_nbest_lists_and_scores_match(trained_run):
    native = Translator.from_run(trained_run, precision="fp32")
    fast = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2")
    seqs = native.encode_sources(_lines(trained_run, "valid.zh")[:40])
    for lp in (1.0, 0.6):
        a = native.engine.search(seqs, 5, 3, lp, False)
        b = fast.engine.search(seqs, 5, 3, lp, False)
        assert sum(x[0][0] == y[0][0] for x, y in zip(a, b, strict=True)) >= 39
        for x, y in zip(a, b, strict=True):
            for (tok_a, score_a), (tok_b, score_b) in zip(x, y, strict=False):
                if tok_a == tok_b:  # step-0 renormalisation of the min_len EOS: about eps/V
                    assert score_b == pytest.approx(score_a, abs=0.02)


@pytest.mark.slow
def test_length_limit_matches_native(trained_run):
    """At max_len nmt closes beams with a forced EOS; the engine rescores CTranslate2's cut hypotheses."""
    native = Translator.from_run(trained_run, precision="fp32")
    fast = Translator.from_run(trained_run, precision="fp32", engine="ctranslate2")
    short = DecodeConfig(max_len_a=0.5, max_len_b=1)  # far too short for these sentences
    ref_engine = native.engine
    ref_engine.decode = short
    fast.engine.decode = short
    seqs = native.encode_sources(_lines(trained_run, "valid.zh")[:30])
    assert [h[0][0] for h in ref_engine.search(seqs, 1, 1, 1.0, True)] == [
        h[0][0] for h in fast.engine.search(seqs, 1, 1, 1.0, True)
    ]
    a, b = ref_engine.search(seqs, 4, 2, 1.0, False), fast.engine.search(seqs, 4, 2, 1.0, False)
    assert all(len(h[0][0]) <= fast.engine.max_len(len(s)) for h, s in zip(b, seqs, strict=True))
    assert sum(x[0][0] == y[0][0] for x, y in zip(a, b, strict=True)) >= 29
    for x, y in zip(a, b, strict=True):
        if x[0][0] == y[0][0]:
            assert y[0][1] == pytest.approx(x[0][1], abs=0.02)


# --------------------------------------------------------------------------- export, manifest, cache


@pytest.mark.slow
def test_engine_cache_follows_the_checkpoint(trained_run, tmp_path):
    """The engine converts into <run>/export once; a changed checkpoint is converted again."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("export", "eval"))
    config = load_config(run / "config.yaml")
    path = run / "checkpoints" / "best.safetensors"
    engine = ct2.CTranslate2Engine.from_checkpoint(run, path, config, ct2.Ct2Device("cpu"), "fp32")
    assert engine.model_dir == ct2_model.default_export_dir(run, path, None)
    assert engine.model_dir.parent == run / "export"
    first = json.loads((engine.model_dir / "manifest.json").read_text())["inputs"]
    again = ct2.CTranslate2Engine.from_checkpoint(run, path, config, ct2.Ct2Device("cpu"), "fp32")
    assert json.loads((again.model_dir / "manifest.json").read_text())["inputs"] == first
    steps = sorted((run / "checkpoints").glob("step_*.safetensors"))
    other = next(p for p in steps if p.read_bytes() != path.read_bytes())
    shutil.copyfile(other, path)  # another model under the same name
    changed = ct2.CTranslate2Engine.from_checkpoint(run, path, config, ct2.Ct2Device("cpu"), "fp32")
    assert json.loads((changed.model_dir / "manifest.json").read_text())["inputs"] != first


@pytest.mark.slow
def test_quantized_export_loads_and_decodes(trained_run, tmp_path):
    from nmt.decode.evaluate import score

    out = ct2_model.export_run(ct2_model.ExportOptions(trained_run, output=tmp_path / "int8", quantization="int8"))
    assert json.loads((out / "manifest.json").read_text())["quantization"] == "int8"
    assert (out / "model.bin").stat().st_size < (
        ct2_model.export_run(ct2_model.ExportOptions(trained_run)) / "model.bin"
    ).stat().st_size
    native = Translator.from_run(trained_run, precision="fp32")
    engine = ct2.CTranslate2Engine(out, native.config.decode, ct2.Ct2Device("cpu"), "auto")
    assert engine.precision == "int8"
    quantized = Translator(None, native.src_tok, native.tgt_tok, native.config, engine=engine)
    src, ref = _lines(trained_run, "valid.zh"), _lines(trained_run, "valid.en")
    bleu_native = score(native.translate(src, beam=5), ref)["bleu"]
    assert score(quantized.translate(src, beam=5), ref)["bleu"] >= bleu_native - 5


def test_precision_maps_to_compute_types():
    cpu = ct2.Ct2Device("cpu")
    assert ct2.compute_type(cpu, "auto") == "default" and ct2.compute_type(cpu, "fp32") == "float32"
    assert ct2.compute_type(cpu, "int8") == "int8"
    if "bfloat16" in ctranslate2.get_supported_compute_types("cpu"):
        assert ct2.compute_type(cpu, "bf16") == "bfloat16"
    else:
        with pytest.raises(NmtError, match=r"--precision bf16: CTranslate2 on cpu supports .*float32"):
            ct2.compute_type(cpu, "bf16")
    with pytest.raises(NmtError, match="--precision 'fp8'"):
        ct2.compute_type(cpu, "fp8")


def test_devices_are_named_without_torch(monkeypatch):
    assert ct2.ct2_device("cpu") == ct2.Ct2Device("cpu") and str(ct2.ct2_device("cpu")) == "cpu"
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    assert ct2.ct2_device("auto").type == "cpu"
    with pytest.raises(NmtError, match=r"--device 'cuda:1': CTranslate2 sees 0 CUDA device"):
        ct2.ct2_device("cuda:1")
    with pytest.raises(NmtError, match=r"--device 'tpu': expected auto, cpu, cuda or cuda:N"):
        ct2.ct2_device("tpu")
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 2)
    assert ct2.ct2_device("auto") == ct2.Ct2Device("cuda", 0) and str(ct2.ct2_device("cuda:1")) == "cuda:1"


@pytest.mark.slow
def test_threads_follow_the_options_then_the_environment(trained_run, monkeypatch):
    out = ct2_model.export_run(ct2_model.ExportOptions(trained_run))
    decode = load_config(trained_run / "config.yaml").decode
    assert ct2.CTranslate2Engine(out, decode, ct2.Ct2Device("cpu"), "fp32", threads=1).threads == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ct2.CTranslate2Engine(out, decode, ct2.Ct2Device("cpu"), "fp32").threads == 1


@pytest.mark.parametrize("engine", [["--engine", "ctranslate2"], []], ids=["ctranslate2", "default-auto"])
@pytest.mark.slow
def test_translate_with_ctranslate2_never_imports_torch(trained_run, engine):
    """`nmt translate --engine ctranslate2` (and the default `auto`) on a run with a fresh export: no
    PyTorch in the process (`python -X importtime` lists every module imported), the same output as in-process."""
    ct2_model.export_run(ct2_model.ExportOptions(trained_run))  # the engine's cache for the run's checkpoint
    src = _lines(trained_run, "valid.zh")[:3]
    cmd = [sys.executable, "-X", "importtime", "-m", "nmt", "translate", "--run", str(trained_run)]
    done = subprocess.run([*cmd, *engine, "--precision", "fp32", *src], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "ctranslate2" in imported and "sentencepiece" in imported  # the listing is real
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "the ctranslate2 path imported torch"
    assert "pydantic" not in imported, "typer >= 0.29 imports pydantic on every command (pyproject.toml pins below)"
    expected = Translator.from_run(trained_run, engine="ctranslate2", precision="fp32").translate(src)
    assert done.stdout.splitlines() == expected


@pytest.mark.slow
def test_auto_engine_is_ctranslate2_only_with_a_current_export(trained_run, tmp_path, monkeypatch):
    from nmt.decode.loading import resolve_engine

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("export", "eval"))
    assert resolve_engine("auto", run, None).name == "native"  # nothing exported: no conversion, decode natively
    out = ct2_model.export_run(ct2_model.ExportOptions(run))
    assert resolve_engine("auto", run, None).name == "ctranslate2"
    assert resolve_engine("auto", run, out).name == "ctranslate2"
    best = run / "checkpoints" / "best.safetensors"
    assert resolve_engine("auto", run, best, ensemble=(best,)).name == "native"  # ensembles are native-only
    chosen = ct2_model.resolve_source(run, None).checkpoint
    other = next(
        p for p in sorted((run / "checkpoints").glob("step_*.safetensors")) if p.read_bytes() != chosen.read_bytes()
    )
    shutil.copyfile(other, chosen)  # the export is now stale
    assert resolve_engine("auto", run, None).name == "native"
    monkeypatch.setattr(ct2_model, "ctranslate2", None)
    assert resolve_engine("auto", run, out).name == "native"  # the package missing: never chosen
    t = Translator.from_run(run, engine="auto", precision="fp32")
    assert t.engine.name == "native"


# --------------------------------------------------------------------------- command line


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _one_line_error(result, expected: str) -> None:
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr


@pytest.mark.slow
def test_cli_translate_with_both_engines(trained_run):
    line = _lines(trained_run, "valid.zh")[0]
    outputs = [
        _invoke("translate", "--run", str(trained_run), "--engine", e, "--precision", "fp32", line).stdout
        for e in ("native", "ctranslate2")
    ]
    assert outputs[0] == outputs[1] and outputs[0].strip()


@pytest.mark.slow
def test_translate_with_an_exported_directory(trained_run, tmp_path):
    """`--checkpoint DIR --engine ctranslate2` decodes with the export alone (its weights and vocabularies)."""
    out = ct2_model.export_run(ct2_model.ExportOptions(trained_run, output=tmp_path / "m"))
    lines = _lines(trained_run, "valid.zh")[:5]
    args = ("translate", "--run", str(trained_run), "--engine", "ctranslate2", "--precision", "fp32", *lines)
    from_export = _invoke(*args, "--checkpoint", str(out)).stdout
    assert from_export == _invoke(*args).stdout and len(from_export.splitlines()) == 5
    _one_line_error(_invoke(*args, "--checkpoint", str(tmp_path)), "not an nmt export (no manifest.json)")


@pytest.mark.slow
def test_cli_eval_with_both_engines(trained_run):
    """`nmt eval --engine ctranslate2` writes its own report beside the native one; the BLEU agree."""
    reports = {}
    for engine, name in (("native", "valid"), ("ctranslate2", "valid.ctranslate2")):
        args = ("--run", str(trained_run), "--split", "valid", "--engine", engine, "--precision", "fp32")
        result = _invoke("eval", *args)
        assert result.exit_code == 0
        reports[engine] = json.loads((trained_run / "eval" / f"{name}.json").read_text(encoding="utf-8"))
        assert reports[engine]["decode"]["engine"] == engine
    assert abs(reports["native"]["bleu"] - reports["ctranslate2"]["bleu"]) <= 0.2


@pytest.mark.slow
def test_cli_errors(trained_run, tmp_path, monkeypatch):
    run = str(trained_run)
    _one_line_error(_invoke("export", "--run", run, "--format", "onnx"), "--format 'onnx': expected one of ctranslate2")
    _one_line_error(_invoke("export", "--run", run, "--quantization", "int3"), "--quantization 'int3': expected")
    (tmp_path / "empty").mkdir()
    _one_line_error(_invoke("export", "--run", str(tmp_path / "empty")), "no checkpoint found")
    _one_line_error(_invoke("export", "--run", str(tmp_path / "missing")), "run directory not found")
    not_ours = tmp_path / "taken"
    not_ours.mkdir()
    _one_line_error(_invoke("export", "--run", run, "--output", str(not_ours)), "is not an nmt export")
    monkeypatch.setattr(ct2_model, "ctranslate2", None)  # as if the optional extra were not installed
    _one_line_error(_invoke("export", "--run", run), "pip install 'nmt[ctranslate2]'")
    _one_line_error(
        _invoke("translate", "--run", run, "--engine", "ctranslate2", "一二"), "pip install 'nmt[ctranslate2]'"
    )

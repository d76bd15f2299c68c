"""End to end through the `nmt` command line (in-process, with Typer's runner)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from nmt.cli import app
from nmt.decode.evaluate import score
from nmt.model.attention import resolve_backend
from nmt.run.checkpoints import complete_checkpoints

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def test_help_lists_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ["download", "vocab", "train", "translate", "eval", "average", "pipeline", "summary"]:
        assert command in result.output


def test_help_shows_extras_in_brackets_verbatim():
    """Help text is not rich markup: `nmt[ctranslate2]` and `nmt[serve]` keep their brackets."""
    assert "nmt[ctranslate2]" in invoke("translate", "--help").output
    assert "nmt[serve]" in " ".join(invoke("serve", "--help").output.split())


def test_main_collects_young_objects_less_often(monkeypatch):
    """`nmt` raises the collector's young-generation threshold before the command runs (start-up:
    PyTorch's import leaves objects the default thresholds make it walk again and again)."""
    import gc

    import nmt.cli

    before, seen = gc.get_threshold(), []
    monkeypatch.setattr(nmt.cli, "app", lambda: seen.append(gc.get_threshold()))
    try:
        nmt.cli.main()
    finally:
        gc.set_threshold(*before)
    assert seen[0][0] == nmt.cli.GC_GEN0 > before[0] and seen[0][1:] == before[1:]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("model:\n  d_modle: 64\n", "unknown key model.d_modle (did you mean 'd_model'?)"),
        ("model:\n  d_model: 30\n  heads: 4\n", "model.d_model: 30 is not divisible by model.heads=4"),
        ("train:\n  lr: -1\n", "train.lr: must be positive"),
    ],
)
def test_bad_config_is_one_line_and_nonzero(tmp_path, yaml_text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    result = invoke("vocab", "--config", str(cfg), "--run", str(tmp_path / "run"))
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(cfg) in lines[0]
    assert "Traceback" not in result.output


def test_unknown_corpus_is_one_line(tmp_path):
    result = invoke(
        "download",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--set",
        "data.corpus=tatoba",
        "--run",
        str(tmp_path / "run"),
        "--mirror",
        str(tmp_path),
    )
    assert result.exit_code == 1
    assert "tatoba" in result.stderr and "tatoeba" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_translate_arguments(tiny_run):
    result = invoke("translate", "--run", str(tiny_run), "我爱 AI", "你好。")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.slow
def test_translate_tunes_the_native_engine_for_how_it_decodes(tiny_run, monkeypatch, tmp_path):
    """Sentences given as arguments are decoded one at a time (the precision and int8 kernel
    measured fastest for one-row steps), a file in batches."""
    import nmt.decode.translator as translator
    from nmt.decode.options import ALONE_ROWS, BATCH_ROWS

    seen = []
    monkeypatch.setattr(translator, "translate_to", lambda opts, **_: seen.append(opts.rows))
    (tmp_path / "in.txt").write_text("你好。\n", encoding="utf-8")
    assert invoke("translate", "--run", str(tiny_run), "你好。").exit_code == 0
    assert invoke("translate", "--run", str(tiny_run), "--input", str(tmp_path / "in.txt")).exit_code == 0
    assert seen == [ALONE_ROWS, BATCH_ROWS] and ALONE_ROWS < BATCH_ROWS


@pytest.mark.slow
def test_serve_is_tuned_for_batches_unless_told_one_sentence_at_a_time(tiny_run, monkeypatch):
    pytest.importorskip("fastapi")
    import nmt.serve.app as app_module
    from nmt.decode.options import ALONE_ROWS, BATCH_ROWS

    seen = []
    monkeypatch.setattr(app_module, "serve", lambda opts, serve_opts: seen.append(opts.rows))
    assert invoke("serve", "--run", str(tiny_run)).exit_code == 0
    assert invoke("serve", "--run", str(tiny_run), "--tune-for", "sentence").exit_code == 0
    assert seen == [BATCH_ROWS, ALONE_ROWS]
    bad = runner.invoke(app, ["serve", "--run", str(tiny_run), "--tune-for", "latency"])
    assert bad.exit_code != 0 and "--tune-for" in bad.output + bad.stderr


@pytest.mark.slow
def test_translate_stdin_keeps_order_and_empty_lines(tiny_run):
    result = invoke("translate", "--run", str(tiny_run), "--beam", "1", input="你好。\n\n我爱你。\n")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) >= 3 and lines[1] == ""


@pytest.mark.slow
def test_translate_file_with_long_and_traditional_lines(tiny_run, tmp_path):
    src = tmp_path / "in.zh"
    src.write_text("瑪麗不像其他女孩一樣。\n\n" + "我" * 5000 + "\n玛丽不像其他女孩一样。\n", encoding="utf-8")
    out = tmp_path / "out.en"
    result = invoke("translate", "--run", str(tiny_run), "--input", str(src), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[1] == ""
    assert lines[0] == lines[3]  # Traditional input is normalised like training (t2s)
    assert "truncat" in result.stderr


def test_translate_missing_run_is_clean(tmp_path):
    result = invoke("translate", "--run", str(tmp_path / "nothing"), "你好")
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_eval_writes_report(tiny_run):
    result = invoke("eval", "--run", str(tiny_run), "--split", "valid", "--beam", "1")
    assert result.exit_code == 0, result.stderr
    data = json.loads((tiny_run / "eval" / "valid.beam1.json").read_text())
    assert data["name"] == "valid.beam1" and data["split"] == "valid" and data["decode"]["beam"] == 1
    assert 0 <= data["bleu"] <= 100 and 0 <= data["chrf"] <= 100
    assert data["bleu_signature"].startswith("nrefs:1|")
    hyps = Path(data["hyp_file"]).read_text(encoding="utf-8").splitlines()
    refs = (tiny_run / "corpus" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs)
    assert data["bleu"] == pytest.approx(score(hyps, refs)["bleu"])  # the report is the score of its own file


def test_summary_names_backend_and_size():
    result = invoke(
        "summary", "--config", str(ROOT / "configs/base.yaml"), "--src-vocab", "32000", "--tgt-vocab", "32000"
    )
    assert result.exit_code == 0
    expected = resolve_backend("auto", torch.device("cpu"), torch.float32, head_dim=512 // 8)  # base: 512, 8 heads
    assert f"attention backend: {expected}" in result.stdout
    assert "6+6 layers, d_model 512" in result.stdout and "M parameters" in result.stdout


@pytest.mark.parametrize("last", [2, 50])  # tiny.yaml keeps 2: --last 50 averages those and says so
@pytest.mark.slow
def test_average_is_the_elementwise_mean_of_the_newest(tiny_run, tmp_path, last):
    out = tmp_path / "avg.safetensors"
    result = invoke("average", "--run", str(tiny_run), "--last", str(last), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    last_two = complete_checkpoints(tiny_run / "checkpoints")[:2]
    assert len(last_two) == 2
    averaged = load_file(str(out))
    for name in ("src_embed.weight", "decoder.layers.0.ffn.fc1.weight"):
        mean = sum(load_file(str(p))[name] for p in last_two) / 2
        torch.testing.assert_close(averaged[name], mean)  # the element-wise mean of the two newest
    said = "--last 50 asked for 50, but the run keeps only 2"
    assert (said in result.stdout) == (last == 50)


@pytest.mark.slow
def test_translate_stdin_with_invalid_utf8_does_not_crash(tiny_run):
    data = b"\xff\xfe\n" + "你好\n".encode()
    result = runner.invoke(app, ["translate", "--run", str(tiny_run), "--beam", "1"], input=data)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split("\n")) >= 2


@pytest.mark.slow
def test_translate_nbest_prints_score_tab_text(tiny_run):
    result = invoke("translate", "--run", str(tiny_run), "--beam", "3", "--nbest", "3", "我爱 AI", "", "你好。")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.rstrip("\n").split("\n")
    assert len(lines) == 9  # K lines per input, blank inputs included
    scores = [line.split("\t", 1)[0] for line in lines]
    assert scores[3:6] == ["nan"] * 3
    for first in (0, 6):
        values = [float(s) for s in scores[first : first + 3]]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert "score<TAB>text" in invoke("translate", "--help").stdout


@pytest.mark.slow
def test_eval_several_external_sets_in_one_call(tiny_run, tmp_path):
    sets = []
    for folder, n in (("news", 4), ("chat", 6)):
        (tmp_path / folder).mkdir()
        for side in ("zh", "en"):
            lines = (tiny_run / "corpus" / f"valid.{side}").read_text(encoding="utf-8").splitlines()[:n]
            (tmp_path / folder / f"test.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        sets += ["--src", str(tmp_path / folder / "test.zh"), "--ref", str(tmp_path / folder / "test.en")]
    result = invoke("eval", "--run", str(tiny_run), "--beam", "1", *sets)
    assert result.exit_code == 0, result.stderr
    for folder, n in (("news", 4), ("chat", 6)):
        report = json.loads((tiny_run / "eval" / f"ext-{folder}.test.beam1.json").read_text())
        assert report["sentences"] == n and report["src"].endswith(f"{folder}/test.zh")
    named = invoke("eval", "--run", str(tiny_run), "--beam", "1", *sets, "--name", "a", "--name", "b")
    assert (
        named.exit_code == 0 and (tiny_run / "eval" / "a.json").is_file() and (tiny_run / "eval" / "b.json").is_file()
    )
    clash = runner.invoke(app, ["eval", "--run", str(tiny_run), *sets, "--name", "x", "--name", "x"])
    assert clash.exit_code == 1 and "two sets would write the same report" in clash.stderr
    uneven = runner.invoke(app, ["eval", "--run", str(tiny_run), *sets[:6]])
    assert uneven.exit_code == 1 and "--src and --ref go together: 2 --src, 1 --ref" in uneven.stderr


@pytest.mark.slow
def test_eval_with_an_ensemble_and_with_sampling(tiny_run):
    final = str(tiny_run / "checkpoints" / "final.safetensors")
    base = ["eval", "--run", str(tiny_run), "--split", "valid", "--beam", "3", "--precision", "fp32"]
    assert invoke(*base, "--checkpoint", final).exit_code == 0
    assert invoke(*base, "--checkpoint", final, "--checkpoint", final).exit_code == 0
    alone = json.loads((tiny_run / "eval" / "valid.beam3.json").read_text())
    twice = json.loads((tiny_run / "eval" / "valid.beam3.ensemble2.json").read_text())
    assert twice["bleu"] == alone["bleu"] and twice["decode"]["ensemble"] == [final]
    assert invoke(*base, "--sample-topk", "0", "--seed", "3").exit_code == 0
    sampled = json.loads((tiny_run / "eval" / "valid.beam3.sample-k0-p1-t1-s3.json").read_text())
    assert sampled["decode"]["sampling"]["seed"] == 3 and sampled["bleu"] != alone["bleu"]


def test_doctor_lists_the_kernels_and_both_workloads_choices(monkeypatch):
    import nmt.decode.precision as precision
    from nmt.hw import host

    times = {precision.ALONE_ROWS: {"fp32": 2.0, "int8": 1.0}, precision.BATCH_ROWS: {"fp32": 1.0, "int8": 1.25}}
    monkeypatch.setattr(precision, "decode_times", lambda shape, rows: times[rows])
    monkeypatch.setattr(precision, "fastest_int8_kernel", lambda shape, rows: f"kernel-for-{rows}")
    result = invoke("doctor")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and all(any(k in line for line in lines) for k in host.KERNELS)
    alone, batches = lines[-2:]
    assert alone.startswith("decoding one sentence at a time") and "int8 2.00x" in alone
    assert alone.endswith("fastest = int8; int8 kernel kernel-for-1")
    assert batches.startswith("decoding batches (64 rows)") and "int8 0.80x" in batches
    assert batches.endswith("fastest = fp32; int8 kernel kernel-for-64")
    assert any(line.endswith("--precision auto decodes in fp32") for line in lines)

"""Training curves read from a run's logs, PNG plots (nmt plot), heatmaps (nmt translate --attention)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nmt.cli import app
from nmt.errors import NmtError
from nmt.run.log import curves_to_json, eval_summary, read_curves, read_eval_reports

pytest.importorskip("matplotlib", reason="plots need the serve extra (matplotlib)")

pytestmark = pytest.mark.usefixtures("one_thread")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tiny_run) -> Path:
    return tiny_run


def _log_series(run: Path, head: str, key: str) -> dict[int, float]:
    """What train.log printed for `key` on its `<head> N | key value | ...` lines (head "step" or "valid step")."""
    out = {}
    for line in (run / "train.log").read_text(encoding="utf-8").splitlines():
        first, *parts = line.split(" ", 2)[-1].split(" | ")  # without the timestamp
        if first.rsplit(" ", 1)[0] == head:
            values = dict(p.split(" ", 1) for p in parts if " " in p)
            if key in values:
                out[int(first.rsplit(" ", 1)[1])] = float(values[key])
    return out


@pytest.mark.slow
def test_curves_are_what_training_logged(run):
    curves = read_curves(run)
    logged = _log_series(run, "step", "loss")
    assert logged and curves["train/loss"].steps == sorted(logged)
    assert curves["train/loss"].values == pytest.approx([logged[s] for s in sorted(logged)], rel=1e-3)
    valid = _log_series(run, "valid step", "bleu")
    assert valid and dict(zip(curves["valid/bleu"].steps, curves["valid/bleu"].values, strict=True)) == pytest.approx(
        valid, abs=1e-3
    )
    lr = _log_series(run, "step", "lr")
    assert curves["train/lr"].values == pytest.approx([lr[s] for s in sorted(lr)], rel=1e-3)
    main = [tag for tag, *_ in curves_to_json(curves)["main"]]
    assert main == ["train/loss", "valid/bleu", "train/lr", "train/tokens_per_s"]


def test_a_run_without_logs_has_no_curves_and_plot_says_so(tmp_path):
    from nmt.serve.plot import plot_run

    assert read_curves(tmp_path) == {}
    with pytest.raises(NmtError, match="no training scalars"):
        plot_run(tmp_path)
    with pytest.raises(NmtError, match="not found"):
        plot_run(tmp_path / "missing")


@pytest.mark.slow
def test_eval_reports_are_read_and_summarised(run, tmp_path):
    reports = read_eval_reports(run)
    test = next(r for r in reports if r["name"] == "test")
    assert len(reports) == len(list((run / "eval").glob("*.json")))
    summary = eval_summary(test)
    assert summary["bleu_signature"].startswith("nrefs:1") and summary["decode"]["beam"] == test["decode"]["beam"]
    assert summary["bleu"] == test["bleu"] > 0
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "broken.json").write_text("{not json", encoding="utf-8")
    assert read_eval_reports(tmp_path) == []


@pytest.mark.slow
def test_nmt_plot_writes_one_png_per_curve(run, tmp_path):
    result = CliRunner().invoke(app, ["plot", "--run", str(run), "--output", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    expected = {f"{tag.replace('/', '_')}.png" for tag in read_curves(run)} | {"curves.png"}
    assert set(files) == expected
    for name in files:
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000
    assert f"wrote {tmp_path / 'plots' / 'curves.png'}" in result.output


@pytest.mark.slow
def test_translate_attention_writes_a_heatmap_per_sentence(run, tmp_path):
    lines = ["他们买了七只红色的猫。", "", "我们九点见。"]
    src = tmp_path / "in.zh"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["translate", "--run", str(run), "--precision", "fp32", "--input", str(src)]
    plain = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "plain.en")])
    result = CliRunner().invoke(
        app, [*args, "--output", str(tmp_path / "att.en"), "--attention", str(tmp_path / "maps")]
    )
    assert plain.exit_code == 0 and result.exit_code == 0, result.output
    assert (tmp_path / "att.en").read_text(encoding="utf-8") == (tmp_path / "plain.en").read_text(encoding="utf-8")
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["1.png", "3.png"]  # line 2 is blank
    assert all((tmp_path / "maps" / n).read_bytes().startswith(PNG) for n in ("1.png", "3.png"))
    assert "wrote 2 heatmaps" in result.output


@pytest.mark.slow
def test_translate_attention_reads_stdin_and_refuses_nbest(run, tmp_path):
    args = ["translate", "--run", str(run), "--precision", "fp32", "--attention", str(tmp_path / "maps")]
    result = CliRunner().invoke(app, args, input="我们九点见。\n".encode() + b"\xff\n")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["1.png", "2.png"]  # invalid UTF-8 → U+FFFD
    refused = CliRunner().invoke(app, [*args, "--nbest", "2", "我们九点见。"])
    assert refused.exit_code == 1 and "drop --nbest" in refused.output

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


def _logged_run(path: Path, bleu: list[float], lr: bool = True) -> Path:
    """A run directory whose tb/ holds what training would log: loss, validation BLEU (and lr)."""
    from nmt.run.log import RunLogWriter

    writer = RunLogWriter(path)
    for i, value in enumerate(bleu):
        writer.scalars("train", {"loss": 5.0 - i, **({"lr": 1e-3 / (i + 1)} if lr else {})}, step=100 * (i + 1))
        writer.scalars("valid", {"bleu": value}, step=100 * (i + 1))
    writer.close()
    return path


def test_compared_runs_share_each_axis_with_a_line_per_run(tmp_path, monkeypatch):
    from nmt.serve import plot

    a = _logged_run(tmp_path / "budget", [1.0, 5.0, 9.0])
    b = _logged_run(tmp_path / "baseline", [2.0, 4.0], lr=False)
    drawn: dict[str, dict[str, list[float]]] = {}
    draw = plot._draw_series
    monkeypatch.setattr(
        plot,
        "_draw_series",
        lambda ax, runs, title, unit: (
            drawn.update({title: {n: s.values for n, s in runs.items()}}) or draw(ax, runs, title, unit)
        ),
    )
    result = CliRunner().invoke(app, ["plot", "-r", str(a), "--compare", str(b), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert drawn["valid/bleu"] == {"budget": [1.0, 5.0, 9.0], "baseline": [2.0, 4.0]}
    assert drawn["validation BLEU (greedy)"] == drawn["valid/bleu"]
    assert set(drawn["train/lr"]) == {"budget"}  # a curve only one run recorded: that run's line alone
    assert (tmp_path / "out" / "curves.png").read_bytes().startswith(PNG)


def test_compared_runs_must_have_curves_and_distinct_names(tmp_path):
    from nmt.serve.plot import plot_run

    a = _logged_run(tmp_path / "x" / "arm", [1.0])
    with pytest.raises(NmtError, match="named alike"):
        plot_run(a, tmp_path / "out", [_logged_run(tmp_path / "y" / "arm", [2.0])])
    (tmp_path / "empty").mkdir()
    with pytest.raises(NmtError, match="empty/tb: no training scalars"):
        plot_run(a, tmp_path / "out", [tmp_path / "empty"])

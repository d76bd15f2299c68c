"""scripts/bench_backtranslation.py: its arms, the time each is given, the refusal path and the
table, with `nmt` replaced by a fake that writes the reports a real run would (no training)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_backtranslation", ROOT / "scripts" / "bench_backtranslation.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def test_help_works():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_backtranslation.py"), "--help"], text=True,
                         capture_output=True, check=True).stdout  # fmt: skip
    assert "--reverse-run" in out and "--cached-too" in out and "--min-valid-bleu" in out


@pytest.fixture
def mirror(tmp_path):
    root = tmp_path / "mirror"
    (root / "wmt-news-zh-en").mkdir(parents=True)
    (root / "wmt-news-zh-en" / "test.jsonl").write_text('{"translation": {"zh": "你好", "en": "Hello"}}\n')
    (root / "tatoeba-mono-en").mkdir()
    (root / "tatoeba-mono-en" / "train.en").write_text("One.\nTwo.\nThree.\n")
    return root


class FakeNmt:
    """Records each command; writes eval reports where `nmt pipeline` / `nmt eval` would;
    `nmt backtranslate` refuses (exit 1, the CLI's line) when `refuse` is set."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple] = []
        self.refuse = refuse

    def __call__(self, core, *args, log, check=True):
        self.calls.append(args)
        log.open("a").write(f"$ {' '.join(args)}\n")
        run = next((args[i + 1] for i, x in enumerate(args) if x == "-r"), None)
        if args[0] == "backtranslate" and self.refuse:
            log.open("a").write("error: reverse model validation BLEU 3.15 (read from x) is below the floor 10\n")
            return 1
        if args[0] == "pipeline":
            report = {"bleu": 20.0, "chrf": 40.0, "bleu_signature": "sig", "by_code": {}}
            (ROOT / run / "eval").mkdir(parents=True, exist_ok=True)
            (ROOT / run / "eval" / "test.json").write_text(json.dumps(report))
        if args[0] == "eval":
            (ROOT / run / "eval" / "newstest2018.json").write_text(json.dumps({"bleu": 10.0, "chrf": 30.0}))
        return 0

    def pipelines(self) -> dict[str, list[str]]:
        """Forward pipelines: run directory name → the -c config and -s settings."""
        out = {}
        for args in self.calls:
            if args[0] == "pipeline" and "-c" in args:
                run = args[args.index("-r") + 1]
                out[run.rsplit("/", 1)[-1]] = [args[i + 1] for i, x in enumerate(args) if x in ("-c", "-s")]
        return out


def seconds(settings: list[str]) -> float:
    return float(next(s for s in settings if s.startswith("train.max_time="))[len("train.max_time=") : -1])


def test_plain_recipe_and_cached_arms_get_their_times_and_rows(mirror, tmp_path, monkeypatch, capsys):
    fake = FakeNmt()
    monkeypatch.setattr(bench, "nmt", fake)
    bench.main(["--budget", "2", "--reverse", "0.5", "--mirror", str(mirror), "--out", str(tmp_path / "out"),
                "--cached-too", "--no-pin", "--mono-lines", "2"])  # fmt: skip
    runs = fake.pipelines()
    assert seconds(runs["plain"]) == 120 and "configs/small.yaml" in runs["plain"]
    assert 100 < seconds(runs["bt-forward"]) <= 120 and "configs/small-bt.yaml" in runs["bt-forward"]
    assert seconds(runs["bt-cached"]) == 120  # only the forward training is counted
    bt = [args for args in fake.calls if args[0] == "backtranslate"]
    assert len(bt) == 2 and all("--no-repeat-ngram" in args and "--min-valid-bleu" in args for args in bt)
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "BLEU" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| plain", "| back-translation", "| back-translation, cached reverse"]
    assert "reverse " in table and "en→zh" in table


def test_a_reverse_run_makes_the_second_arm_cached(mirror, tmp_path, monkeypatch, capsys):
    reverse = tmp_path / "enzh"
    reverse.mkdir()
    (reverse / "config.yaml").write_text("name: enzh\n")
    fake = FakeNmt()
    monkeypatch.setattr(bench, "nmt", fake)
    bench.main(["--budget", "1", "--mirror", str(mirror), "--out", str(tmp_path / "out"), "--no-pin",
                "--reverse-run", str(reverse)])  # fmt: skip
    assert not any(args[0] == "train" for args in fake.calls)  # no reverse model trained
    assert set(fake.pipelines()) == {"plain", "bt-cached"}
    assert "| back-translation, cached reverse |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.parse_args(["--reverse-run", str(tmp_path / "nothing")])


def test_a_refused_reverse_model_leaves_plain_training_for_the_time_left(mirror, tmp_path, monkeypatch, capsys):
    fake = FakeNmt(refuse=True)
    monkeypatch.setattr(bench, "nmt", fake)
    bench.main(["--budget", "1", "--mirror", str(mirror), "--out", str(tmp_path / "out"), "--no-pin"])
    assert "configs/small.yaml" in fake.pipelines()["bt-forward"]
    assert "(reverse refused: plain)" in capsys.readouterr().out


def test_arms_runs_only_the_arms_named(mirror, tmp_path, monkeypatch, capsys):
    fake = FakeNmt()
    monkeypatch.setattr(bench, "nmt", fake)
    out = tmp_path / "out"
    bench.main(["--budget", "1", "--mirror", str(mirror), "--out", str(out), "--no-pin", "--arms", "recipe"])
    assert set(fake.pipelines()) == {"bt-forward"}  # no plain twin trained
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| back-translation")]
    assert len(rows) == 1
    (out / "enzh").mkdir(parents=True, exist_ok=True)
    (out / "enzh" / "config.yaml").write_text("name: enzh\n")
    fake.calls.clear()
    bench.main(["--budget", "1", "--mirror", str(mirror), "--out", str(out), "--no-pin", "--arms", "cached"])
    assert set(fake.pipelines()) == {"bt-cached"}
    bt = next(args for args in fake.calls if args[0] == "backtranslate")
    assert bt[bt.index("-r") + 1] == str(out / "enzh") and bt[bt.index("-o") + 1] == str(out / "bt")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arms", "plain,beam"], "distinct arms"),
        (["--arms", "plain,plain"], "distinct arms"),
        (["--arms", "plain", "--cached-too"], "name the cached arm"),
        (["--arms", "cached"], "needs --reverse-run"),
    ],
)
def test_arms_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args([*argv, "--out", str(tmp_path / "empty")])
    assert message in capsys.readouterr().err

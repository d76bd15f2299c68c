"""scripts/bench_ablation.py: arms parsed, data prepared once and linked, arms trained in rounds of
one per core with their overrides, chosen on validation, tabled; `nmt` replaced by a fake that
writes what a real run would (no training)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_ablation", ROOT / "scripts" / "bench_ablation.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def test_an_arm_is_a_name_and_overrides():
    assert bench.parse_arm("baseline") == ("baseline", [])
    assert bench.parse_arm("b=train.schedule=budget-linear,train.ema_decay=0.999") == (
        "b",
        ["train.schedule=budget-linear", "train.ema_decay=0.999"],
    )
    for bad in ("", "=train.lr=1", "x=lr=1", "x=train.lr"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_arm(bad)


class FakeNmt:
    """`nmt download|vocab|train` as files: prepared data in the base run, a summary and a log per arm."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int | None]] = []

    def __call__(self, args: list[str], log: Path, core: int | None = None) -> int:
        self.calls.append((args, core))
        run = Path(args[args.index("--run") + 1])
        run.mkdir(parents=True, exist_ok=True)
        if args[0] == "download":
            (run / "corpus").mkdir(exist_ok=True)
            (run / "corpus" / "train.zh").write_text("你好\n")
            (run / "download.stamp.json").write_text("{}")
        elif args[0] == "vocab":
            (run / "vocab").mkdir(exist_ok=True)
            (run / "vocab" / "zh.model").write_bytes(b"model")
        else:
            sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
            lr = 0.0 if "train.schedule=budget-linear" in sets else 7e-4
            steps = 100 + len(sets)
            t = "2026-12-03 14:00:00"
            (run / "train.log").write_text(
                f"{t} step 50 | loss 3.0 | lr 1.000e-03 | tokens_per_s 1000 | epoch 0.5\n"
                f"{t} valid step 90 | loss 3.1 | bleu 20.0 | chrf 40.0 | best bleu 20.00 @ 90\n"
                f"{t} step {steps} | loss 2.0 | lr {lr:.3e} | tokens_per_s 2000 | epoch 1.5\n"
                f"{t} stopped: max_time at step {steps} (60 s of training-loop wall time)\n"
            )
        return 0


def test_arms_share_one_preparation_and_train_one_per_core(tmp_path, monkeypatch, capsys):
    fake = FakeNmt()
    monkeypatch.setattr(bench, "nmt", fake)
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1})
    chosen = {"a": ("averaged", 25.5), "budget": ("best", 26.25), "ema": ("averaged", 27.0)}
    monkeypatch.setattr(
        bench,
        "select",
        lambda run: {"chosen": chosen[run.name][0], "valid_bleu": {chosen[run.name][0]: chosen[run.name][1]}},
    )
    arms = ["--arm", "a", "--arm", "budget=train.schedule=budget-linear", "--arm", "ema=train.ema_decay=0.999"]
    assert bench.main([*arms, "--work", str(tmp_path), "--budget", "1m", "--mirror", "M"]) == 0

    stages = [args[0] for args, _ in fake.calls]
    assert stages == ["download", "vocab", "train", "train", "train"]  # prepared once
    trains = [(args, core) for args, core in fake.calls if args[0] == "train"]
    assert [core for _, core in trains] == [0, 1, 0]  # two rounds on two cores
    assert all("train.max_time=1m" in args and "train.threads=1" in args for args, _ in trains)
    prepared = tmp_path / "prepared" / "corpus" / "train.zh"
    for arm in ("a", "budget", "ema"):
        assert (tmp_path / arm / "corpus" / "train.zh").stat().st_ino == prepared.stat().st_ino  # linked, not copied
    rows = json.loads((tmp_path / "ablation.json").read_text())
    assert [(r["arm"], r["chosen"], r["valid_bleu"]) for r in rows] == [
        ("a", "averaged", 25.5),
        ("budget", "best", 26.25),
        ("ema", "averaged", 27.0),
    ]
    assert rows[1]["last_lr"] == 0.0 and rows[0]["last_lr"] == 7e-4
    assert (rows[0]["updates"], rows[0]["epochs"], rows[0]["tokens_per_s"]) == (102, 1.5, 1500.0)
    assert (rows[0]["best_greedy"], rows[0]["best_step"]) == (20.0, 90)
    out = capsys.readouterr().out
    assert "train.schedule=budget-linear" in out and "26.25" in out
    calls = len(fake.calls)
    assert bench.main([*arms, "--work", str(tmp_path), "--budget", "1m", "--mirror", "M"]) == 0
    assert [args[0] for args, _ in fake.calls[calls:]] == ["download", "vocab"]  # trained arms are kept


def test_arm_names_must_differ(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--arm", "a", "--arm", "a=train.lr=1", "--work", str(tmp_path)])


def test_an_arm_with_its_own_config_gets_its_own_preparation(tmp_path, monkeypatch):
    fake = FakeNmt()
    monkeypatch.setattr(bench, "nmt", fake)
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(bench, "select", lambda run: {"chosen": "best", "valid_bleu": {"best": 1.0}})
    args = ["--arm", "base", "--arm", "mix", "--arm-config", "mix=configs/small-mix.yaml", "--work", str(tmp_path)]
    assert bench.main([*args, "--mirror", "M"]) == 0
    prepared = {(a[0], a[a.index("--config") + 1], Path(a[a.index("--run") + 1]).name) for a, _ in fake.calls}
    assert {p for p in prepared if p[0] != "train"} == {
        ("download", "configs/small.yaml", "prepared"),
        ("vocab", "configs/small.yaml", "prepared"),
        ("download", "configs/small-mix.yaml", "prepared-small-mix"),
        ("vocab", "configs/small-mix.yaml", "prepared-small-mix"),
    }
    assert {(c, r) for s, c, r in prepared if s == "train"} == {
        ("configs/small.yaml", "base"),
        ("configs/small-mix.yaml", "mix"),
    }
    mix = (tmp_path / "mix" / "corpus" / "train.zh").stat().st_ino
    assert mix == (tmp_path / "prepared-small-mix" / "corpus" / "train.zh").stat().st_ino
    with pytest.raises(SystemExit):
        bench.main(["--arm", "a", "--arm-config", "b=configs/x.yaml", "--work", str(tmp_path)])

"""`RunDir` names the files the run directory's map (`nmt/run/__init__.py`) describes."""

from __future__ import annotations

import inspect
from pathlib import Path

import nmt.run
from nmt.run import layout
from nmt.run.layout import RunDir


def named_paths(run: RunDir) -> dict[str, Path]:
    """Every path `run` names, by member, each method asked with sample arguments."""
    samples = {"split": "valid", "lang": "zh", "name": "test", "suffix": "hyp", "stage": "train", "launch": "7"}
    found = {}
    for name, member in inspect.getmembers(RunDir):
        if name.startswith("_") or name == "path":
            continue
        if isinstance(member, property):
            found[name] = getattr(run, name)
        else:
            params = list(inspect.signature(member).parameters)[1:]
            found[name] = getattr(run, name)(*(samples[p] for p in params))
    return found


def test_every_name_lies_in_the_run_and_is_in_the_map():
    run = RunDir("runs/x")
    paths = named_paths(run)
    assert {"config", "corpus_file", "vocab_model", "checkpoints", "eval_report", "stamp"} <= paths.keys()
    for name, path in paths.items():
        top = path.relative_to(run.path).parts[0]  # raises for a path outside the run
        assert (top.split(".")[0] or top.split("-")[0]) in nmt.run.__doc__, name
    constants = [v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)]
    assert all(c in nmt.run.__doc__ for c in constants)


def test_run_dir_takes_a_string_or_a_path_and_compares_by_path():
    assert RunDir("runs/x") == RunDir(Path("runs/x"))
    assert RunDir("runs/x").vocab_model("en") == Path("runs/x/vocab/en.model")
    assert RunDir("runs/x").stamp("select") == Path("runs/x/select.stamp.json")
    assert RunDir("runs/x").eval_report("wmt_news.test") == Path("runs/x/eval/wmt_news.test.json")

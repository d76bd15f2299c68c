"""Shared fixtures: a synthetic zh-en mirror (tests/synthetic.py), small configs, a trained tiny run.

Every fixture here works without the real data mirror. `shared_data` gives the real mirror
(`../shared/data`, or `$NMT_TEST_MIRROR`) and skips where it is absent; run the suite with
`NMT_TEST_MIRROR=/nonexistent` to see what a fresh clone sees.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from learning import TEST_SEED
from synthetic import pairs as synthetic_pairs
from tiers import check_tiers, trains

from nmt.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("NMT_TEST_MIRROR", ROOT.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


def has_real_mirror() -> bool:
    return (SHARED_DATA / "tatoeba-zh-en" / "train.jsonl").is_file()


@pytest.fixture
def shared_data() -> Path:
    """The real mirror. Tests using it (or marked real_data) are only collected where it exists."""
    if not has_real_mirror():
        pytest.skip(f"real corpus mirror not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(params=["generated", pytest.param("real", marks=pytest.mark.real_data)])
def any_mirror(request, mini_mirror) -> Path:
    """The generated mirror, and the real one where it exists (the real case is deselected without it)."""
    return mini_mirror if request.param == "generated" else request.getfixturevalue("shared_data")


def pytest_configure(config):
    config.addinivalue_line("markers", "real_data: uses the real corpus mirror; deselected where it is absent")


_REAL_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    n = config.stash.get(_REAL_DESELECTED, 0)
    if n:
        checks = f"{n} check{'s' * (n > 1)}"
        terminalreporter.write_line(f"{checks} on the real corpus deselected: no mirror at {SHARED_DATA}")


def pytest_report_header(config):
    where = "found" if has_real_mirror() else "absent: tests on it are deselected, the generated corpus is used"
    return f"real corpus mirror {SHARED_DATA}: {where}"


@pytest.fixture
def tiny_config() -> Config:
    return load_config(ROOT / "configs" / "tiny.yaml")


KIND_GROUPS = ("learning", "invariance", "precision", "int8")  # scripts/test_kinds.py runs these per CPU kind


def pytest_runtest_logreport(report):
    """With NMT_KINDS_REPORT set (scripts/test_kinds.py), one JSON line per test: its groups and outcome."""
    path = os.environ.get("NMT_KINDS_REPORT")
    if not path or not (report.when == "call" or report.outcome == "failed" or report.skipped):
        return
    groups = _REPORT_GROUPS.get(report.nodeid, [])
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "groups": groups, "outcome": report.outcome}) + "\n")


_REPORT_GROUPS: dict[str, list[str]] = {}


def pytest_collection_modifyitems(config, items):
    check_tiers(items)  # the tiers are marked in the test files; a test that trains must say slow
    _REPORT_GROUPS.update({i.nodeid: [g for g in KIND_GROUPS if g in i.keywords] for i in items})
    if not has_real_mirror():  # extra checks on the real data: not run (rather than skipped) without it
        real = [i for i in items if "real_data" in i.keywords or "shared_data" in getattr(i, "fixturenames", ())]
        if real:
            config.stash[_REAL_DESELECTED] = len(real)
            config.hook.pytest_deselected(items=real)
            items[:] = [i for i in items if i not in real]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mini_mirror(tmp_path_factory) -> Path:
    """A small mirror in the real schema, generated: 2,000 train, 100 valid, 100 test pairs + test.codes.txt."""
    from synthetic import write_mirror

    return write_mirror(tmp_path_factory.mktemp("mirror"), train=2000, valid=100, test=100)


# configs/tiny.yaml made just big enough to learn the synthetic task in seconds (see tests/test_pipeline.py)
TINY_LEARNS = [
    "model.d_model=64",
    "model.ffn_dim=128",
    "train.lr=5.0e-3",
    "train.warmup=30",
    "train.max_steps=200",
    "train.eval_every=100",
    "train.threads=1",
    "vocab.tgt_size=128",  # what the generated English supports
    f"train.seed={TEST_SEED}",
]


def pipeline_on_one_thread(config: Config, run_dir: Path, mirror: Path) -> dict:
    """`nmt pipeline` of `config` into a new `run_dir` on the mirror, on one thread (a tiny model
    trains fastest there, and the cores are shared); returns the pipeline's result."""
    from nmt.pipeline import run_pipeline
    from nmt.run.dirs import init_run

    init_run(config, run_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_pipeline(config, run_dir, mirror=str(mirror))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
@trains
def tiny_run(tmp_path_factory, mini_mirror) -> Path:
    """A finished `nmt pipeline` run of configs/tiny.yaml (+ TINY_LEARNS) on the mini mirror (made once)."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    pipeline_on_one_thread(load_config(ROOT / "configs" / "tiny.yaml", TINY_LEARNS), run_dir, mini_mirror)
    return run_dir


@pytest.fixture(scope="module")
def trained_run(tiny_run, tmp_path_factory) -> Path:
    """A module's own copy of the trained tiny run (config, corpus, vocab, checkpoints; no eval/ or
    export/), for tests that export or evaluate into it."""
    run = tmp_path_factory.mktemp("copied") / "tiny"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval", "export"))
    return run


@pytest.fixture(scope="session")
@trains
def tiny_en_zh_run(tmp_path_factory, mini_mirror) -> Path:
    """The same, the other way: data.direction en-zh (about 20 s on one core; made once)."""
    learn = [x for x in TINY_LEARNS if not x.startswith("vocab.tgt_size")]
    config = load_config(ROOT / "configs" / "tiny.yaml", [*learn, "data.direction=en-zh", "vocab.src_size=128"])
    run_dir = tmp_path_factory.mktemp("runs") / "enzh"
    pipeline_on_one_thread(config, run_dir, mini_mirror)
    return run_dir


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and the CI machine's cores are shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextlib.contextmanager
def warns(match: str = ""):
    """The block must `nmt.errors.warn` (a `warning: ...` line on stderr), one of its lines matching
    `match` (a regex) when given; what it printed is in the yielded buffer."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        yield buf
    said = [line for line in buf.getvalue().splitlines() if line.startswith("warning: ")]
    assert said, f"no warning line; stderr was {buf.getvalue()!r}"
    assert not match or any(re.search(match, line) for line in said), f"no warning matches {match!r}: {said}"


SPM_PAIRS = synthetic_pairs(400, seed=5)  # what the `spm_models` fixture is trained on


@pytest.fixture(scope="session")
def spm_models(tmp_path_factory):
    """Unigram models of both sides of `SPM_PAIRS`, with byte fallback (a made-up Latin span
    encodes without <unk>) and two placeholders as user-defined pieces, as `nmt vocab` adds them."""
    root = tmp_path_factory.mktemp("spm")
    out = []
    for side, lang in enumerate(("zh", "en")):
        (root / f"{lang}.txt").write_text("\n".join(p[side] for p in SPM_PAIRS) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(root / f"{lang}.txt"), model_prefix=str(root / lang), vocab_size=(500, 400)[side],
            byte_fallback=True, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
            user_defined_symbols=["⦅0⦆", "⦅1⦆"],
        )  # fmt: skip
        out.append(root / f"{lang}.model")
    return out


@pytest.fixture(scope="session")
def spm_encoded(spm_models):
    """`SPM_PAIRS` as stored pieces (the best segmentation), as `nmt vocab` writes them."""
    sps = [spm.SentencePieceProcessor(model_file=str(m)) for m in spm_models]
    return [(np.array(sps[0].encode(zh)), np.array(sps[1].encode(en))) for zh, en in SPM_PAIRS]


def record_step_grads(trainer) -> list[torch.Tensor]:
    """A list that gets a clone of every gradient `trainer`'s optimizer steps with, in
    `trainer.params` order, at each step (the step itself still runs)."""
    seen: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def recorded(*args, **kwargs):
        seen.extend(p.grad.clone() for p in trainer.params)
        return step(*args, **kwargs)

    trainer.optimizer.step = recorded
    return seen

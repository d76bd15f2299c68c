"""The raw path: exported models meet names and numbers unmasked (docs/data.md, "What each runtime does").

nmt's `Translator` hides pass-through spans behind placeholders; an Argos Translate package and the
transformers export get the raw text, so there the model itself must copy a name or a number.
`data.passthrough_unmasked` leaves a share of the span-holding training pairs unmasked so that it
learns to. Two tiny runs are trained on the generated corpus with its names-and-numbers grammar
(tests/synthetic.py, `spans`): one with `data.passthrough_unmasked: 0.5`, a control with 0. Every
name and number of the test split sits in a sentence slot that the training split never filled
with it (`synthetic.held_out`), so a span is kept only by carrying it over from the source.

Scores are `nmt.data.passthrough.score_lines` on the test lines that hold a span, greedy everywhere:
nmt with masking off (`nmt eval --no-passthrough`), the Argos package in a real Argos Translate
(`ARGOS_BEAM_SIZE=1`, float32), the transformers export through its own tokenizer and `generate`.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_LEARNS
from learning import assert_learned
from synthetic import span_texts, write_mirror
from tiers import trains

from nmt.config import Config, load_config
from nmt.data.passthrough import score_lines

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

needs_argos = pytest.mark.skipif(
    find_spec("argostranslate") is None or find_spec("ctranslate2") is None,
    reason="argostranslate and ctranslate2 are not installed: pip install -e '.[test]'",
)
needs_transformers = pytest.mark.skipif(
    find_spec("transformers") is None, reason="optional extra nmt[transformers] is not installed"
)

# TINY_LEARNS with what copying needs: more updates (the plain grammar is learnt in 200, carrying a
# name into a slot it never filled takes several times as many), vocabularies that hold every
# name and number as pieces, and room in the length limit: the source vocabulary merges whole
# phrases (`▁他的房间是` is one piece), so a source is a handful of pieces while the English spells
# a name in several, and 1.2 · source + 5 cut raw outputs off before the span.
SPAN_LEARNS = [
    *TINY_LEARNS,
    "train.max_steps=800",
    "train.eval_every=400",
    "vocab.src_size=800",
    "vocab.tgt_size=300",
    "decode.max_len_b=30",
]
UNMASKED = 0.5  # data.passthrough_unmasked of the run under test; the control has 0
RUNS = ("unmasked", "control")


def _train(config: Config, run_dir: Path, mirror: Path) -> Path:
    """`nmt train` (prepare + train; no select, eval or export stage) on one thread."""
    from nmt.pipeline import prepare_and_train
    from nmt.run.dirs import init_run

    init_run(config, run_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare_and_train(config, run_dir, mirror=str(mirror))
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.fixture(scope="module")
def span_mirror(tmp_path_factory) -> Path:
    """The generated mirror every run here trains on (7 pairs in 10 from the span grammar)."""
    return write_mirror(tmp_path_factory.mktemp("span-mirror"), train=2000, valid=100, test=200, spans=0.7)


@pytest.fixture(scope="module")
@trains
def runs(tmp_path_factory, span_mirror) -> dict[str, Path]:
    """The two trained runs compared on every runtime: with span pairs unmasked, and the control."""
    mirror, root = span_mirror, tmp_path_factory.mktemp("span-runs")
    out = {}
    for name, share in zip(RUNS, (UNMASKED, 0.0), strict=True):
        config = load_config(ROOT / "configs" / "tiny.yaml", [*SPAN_LEARNS, f"data.passthrough_unmasked={share}"])
        out[name] = _train(config, root / name, mirror)
    return out


def _span_lines(run: Path) -> tuple[list[str], list[str]]:
    """The test split's (sources, references) that hold a name or a number on both sides."""
    src = (run / "corpus" / "test.zh").read_text(encoding="utf-8").splitlines()
    ref = (run / "corpus" / "test.en").read_text(encoding="utf-8").splitlines()
    kept = [(s, r) for s, r in zip(src, ref, strict=True) if span_texts(s, r)]
    return [s for s, _ in kept], [r for _, r in kept]


def _score(run: Path, hyps: list[str]) -> dict:
    src, ref = _span_lines(run)
    return score_lines(load_config(run / "config.yaml").data, src, ref, hyps)


@pytest.fixture(scope="module")
def nmt_greedy(runs) -> dict[str, dict[str, list[str]]]:
    """nmt's greedy outputs of each run's span lines: {"raw": masking off, "masked": the default}."""
    from nmt.decode.translator import Translator

    out = {}
    for name, run in runs.items():
        src, _ = _span_lines(run)
        raw = Translator.from_run(run, engine="native", precision="fp32", passthrough=False)
        masked = Translator.from_run(run, engine="native", precision="fp32")
        assert raw.masker is None and masked.masker is not None
        out[name] = {"raw": raw.translate(src, beam=1), "masked": masked.translate(src, beam=1)}
    return out


def _same_lines(a: list[str], b: list[str]) -> int:
    return sum(" ".join(x.split()) == " ".join(y.split()) for x, y in zip(a, b, strict=True))


def _contexts(zh: str, en: str) -> set[tuple[str, str, str, bool]]:
    """(span, the character before it or "^", the one after it, whether a digit follows that):
    the slot a name or number fills in a (normalised) source, `有` before an amount and `有` as a
    verb told apart."""
    out = set()
    for text in span_texts(zh, en):
        i = zh.index(text)
        j = i + len(text)
        after = zh[j] if j < len(zh) else "$"
        out.add((text, zh[i - 1] if i else "^", after, j + 1 < len(zh) and zh[j + 1].isdigit()))
    return out


def test_test_spans_sit_where_training_never_had_them(runs):
    """The premise: enough span lines, and not one of their names or numbers in a slot where the
    training split had it (so keeping a span is carrying it over, not recalling the sentence)."""
    from nmt.data.normalize import normalize_source

    run = runs["unmasked"]
    data = load_config(run / "config.yaml").data
    src, ref = _span_lines(run)
    test = [c for s, r in zip(src, ref, strict=True) for c in _contexts(normalize_source(s, data), r)]
    assert len(src) >= 100 and len(test) >= 150
    train_src = (run / "corpus" / "train.zh").read_text(encoding="utf-8").splitlines()  # normalised
    train_ref = (run / "corpus" / "train.en").read_text(encoding="utf-8").splitlines()
    seen = {c for s, r in zip(train_src, train_ref, strict=True) for c in _contexts(s, r)}
    assert len(seen) >= 150, "training has the spans in many slots"
    assert not seen & set(test), sorted(seen & set(test))[:5]


@pytest.mark.learning
def test_nmt_raw_path_keeps_spans_only_when_trained_unmasked(runs, nmt_greedy):
    """`nmt eval --no-passthrough`'s path (translator.masker None), greedy: the run trained with
    half its span pairs unmasked keeps a clear majority of the spans; the control, whose training
    never showed a raw span (its source vocabulary has not even the letters: byte pieces), keeps
    almost none. The masked path keeps nearly every span in both (restore appends a dropped one)."""
    scores = {name: {path: _score(runs[name], hyps) for path, hyps in out.items()} for name, out in nmt_greedy.items()}
    print({name: {p: s["accuracy"] for p, s in by.items()} for name, by in scores.items()}, file=sys.stderr)
    raw_u, raw_c = scores["unmasked"]["raw"]["accuracy"], scores["control"]["raw"]["accuracy"]
    assert_learned("raw-path/nmt_raw_unmasked", raw_u, 0.5)
    assert_learned("raw-path/nmt_raw_margin_over_control", raw_u - raw_c, 0.3)
    for name in RUNS:
        assert_learned(f"raw-path/nmt_masked_{name}", scores[name]["masked"]["accuracy"], 0.9)


@needs_argos
@pytest.mark.learning
def test_argos_package_keeps_spans_as_nmt_raw_path(runs, nmt_greedy, tmp_path_factory):
    """Each run's package, installed into a real Argos Translate (network refused), translates the
    span lines greedily in float32: the unmasked run's package keeps a majority of the spans, its
    score within 2 % of the spans of nmt's own raw-path score (the same model, tokens and greedy
    search; Argos differs only in its 256-token length limit and `<unk>` replacement), line by line
    nearly nmt's text; the control's package scores far lower."""
    from nmt.export.argos_check import argos_translate
    from nmt.export.ct2_model import ExportOptions
    from nmt.export.formats import export

    scores, nmt_scores = {}, {}
    for name, run in runs.items():
        src, _ = _span_lines(run)
        package = export(ExportOptions(run, output=tmp_path_factory.mktemp("pkg") / "zh_en.argosmodel", format="argos"))
        env = {"ARGOS_COMPUTE_TYPE": "float32", "ARGOS_BEAM_SIZE": "1"}
        got = argos_translate(package, src, tmp_path_factory.mktemp("argos-home"), env)
        assert got["network"] == [], "Argos tried to reach the network"
        scores[name], nmt_scores[name] = _score(run, got["outputs"]), _score(run, nmt_greedy[name]["raw"])
        same = _same_lines(got["outputs"], nmt_greedy[name]["raw"])
        print(f"{name}: Argos {scores[name]}, nmt raw {nmt_scores[name]}, {same}/{len(src)} same", file=sys.stderr)
        assert abs(scores[name]["kept"] - nmt_scores[name]["kept"]) <= max(1, 0.02 * scores[name]["spans"]), name
        assert same >= 0.95 * len(src), f"{name}: Argos and nmt's raw path agree on {same} of {len(src)} lines"
    assert_learned("raw-path/argos_unmasked", scores["unmasked"]["accuracy"], 0.5)
    margin = scores["unmasked"]["accuracy"] - scores["control"]["accuracy"]
    assert_learned("raw-path/argos_margin_over_control", margin, 0.3)


@needs_transformers
@pytest.mark.learning
def test_transformers_export_keeps_spans_as_nmt_raw_path(runs, nmt_greedy, tmp_path_factory):
    """Each run's transformers export, through `AutoTokenizer` on the raw line and greedy
    `generate` with nmt's length limit as `max_new_tokens`: the same text as nmt's raw path on
    every span line (test_transformers.py shows the export's greedy search is nmt's, token for
    token), so the same score; the control's export scores far lower."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from nmt.export.ct2_model import ExportOptions
    from nmt.export.formats import export

    scores = {}
    for name, run in runs.items():
        src, _ = _span_lines(run)
        folder = export(ExportOptions(run, output=tmp_path_factory.mktemp("hf") / "zh-en", format="transformers"))
        tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        d = load_config(run / "config.yaml").decode
        hyps = []
        for line in src:
            batch = tokenizer([line], return_tensors="pt")
            limit = int(d.max_len_a * (batch["input_ids"].shape[1] - 1) + d.max_len_b)  # nmt's, source without EOS
            with torch.no_grad():
                out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit)
            hyps.append(" ".join(tokenizer.decode(out[0], skip_special_tokens=True).split()))
        scores[name] = _score(run, hyps)
        same = _same_lines(hyps, nmt_greedy[name]["raw"])
        print(f"{name}: transformers {scores[name]}, {same}/{len(src)} lines as nmt raw", file=sys.stderr)
        assert same == len(src), f"{name}: transformers and nmt's raw path differ on {len(src) - same} lines"
        assert scores[name] == _score(run, nmt_greedy[name]["raw"])
    assert_learned("raw-path/transformers_unmasked", scores["unmasked"]["accuracy"], 0.5)
    margin = scores["unmasked"]["accuracy"] - scores["control"]["accuracy"]
    assert_learned("raw-path/transformers_margin_over_control", margin, 0.3)
